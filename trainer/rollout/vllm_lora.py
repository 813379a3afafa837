"""A LoRA actor's weight sync into vLLM as an adapter (`rollout.vllm.lora_sync`), instead of merged full weights.

LoRA freezes the base weights, so the engine's copy of them (loaded from `model.path` when it started) never
goes stale: only the adapter changes. With `adapter`, the engine starts with vLLM's LoRA support on
(`enable_lora`, one adapter slot, the smallest rank vLLM offers that holds `model.lora.r`), and each sync:

1. writes the actor's current adapter as a PEFT adapter directory (`adapter_config.json` and
   `adapter_model.safetensors`: the `lora_A`/`lora_B` tensors under the names PEFT saves them with) into a
   scratch folder;
2. loads it into the engine under a new adapter id (`add_lora`, eagerly, so the folder is deleted right
   after) and removes the previous one; every later request names the new id, and since vLLM's prefix
   cache is keyed by adapter, prompts cached under the old adapter are never reused.

What moves per sync is the adapter (r x (in + out) numbers per adapted layer) instead of every weight of
the model, and nothing is merged or repacked. The price is at sampling: vLLM adds the adapter's two thin
matrix products to each adapted layer on every decode step. `benchmarks/lora_sync.py` measures both ways;
`auto` takes what it found faster (see `uses_adapter`). `merged` (`trainer.rollout.weight_stream`) is what
`auto` falls back to above vLLM's largest rank. A model vLLM has no LoRA support for is not detected here:
`adapter` (or `auto` on a GPU) fails at the engine's start with vLLM's own message, and `merged` is the choice.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from torch import Tensor, nn

from trainer.config import LoraConfig, VLLMConfig
from trainer.config.stages import VLLM_MAX_LORA_RANK, adapter_sync_problem
from trainer.errors import ConfigError
from trainer.parallel.booster import unwrap_model
from trainer.rollout.weight_stream import checkpoint_name_map, full_tensor

# vLLM's `max_lora_rank` choices (vllm.config.lora.MaxLoRARanks): the engine reserves room for this rank.
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, VLLM_MAX_LORA_RANK)
ADAPTER_PIECES = {".lora_A.default.weight": ".lora_A.weight", ".lora_B.default.weight": ".lora_B.weight"}
# PEFT's saved adapters name each tensor after the model wrapped twice (PeftModel -> LoraModel -> model).
PEFT_PREFIX = "base_model.model."


def uses_adapter(options: VLLMConfig, lora: LoraConfig | None, on_cpu: bool) -> bool:
    """Whether syncs push the adapter alone: `lora_sync` as set, `auto` resolved.

    `auto` merges on the CPU: there vLLM's LoRA products (`PunicaWrapperCPU`) made each sampled batch 1.6-2.3x
    slower, while the adapter's push saved under 0.3 s per sync on a 96M model (`benchmarks/lora_sync.py`).
    On GPUs it pushes the adapter, which is what vLLM's GPU LoRA kernels are built for and where a full-weight
    push of a large model costs seconds and a copy of every weight; that side is not measured here (no GPU).

    Raises:
        ConfigError: `adapter` without `model.lora`, or with a rank vLLM cannot serve (a stage's config refuses
            both when it is loaded).
    """
    problem = adapter_sync_problem(options.lora_sync, lora)
    if problem:
        raise ConfigError(problem)
    if options.lora_sync == "merged" or lora is None or lora.r > VLLM_MAX_LORA_RANK:
        return False
    return options.lora_sync == "adapter" or not on_cpu


def engine_lora_options(lora: LoraConfig) -> dict[str, Any]:
    """`LLM(...)` arguments that make room for one adapter of `lora`'s rank."""
    return {"enable_lora": True, "max_loras": 1, "max_lora_rank": next(r for r in VLLM_LORA_RANKS if r >= lora.r)}


def adapter_tensors(policy: nn.Module) -> Iterator[tuple[str, Tensor]]:
    """The actor's `lora_A`/`lora_B` weights under the names a saved PEFT adapter gives them, whole (a sharded
    tensor is gathered, as `weight_stream` does)."""
    model = unwrap_model(policy)
    state = model.state_dict()
    layers = sorted({name[:-len(piece)] for name in state for piece in ADAPTER_PIECES if name.endswith(piece)})
    # The checkpoint name of each adapted layer's weight (`model.layers.0.self_attn.q_proj.weight` and the like).
    mapping = checkpoint_name_map(model, [f"{layer}.weight" for layer in layers]) or {}
    for name, tensor in state.items():
        piece = next((piece for piece in ADAPTER_PIECES if name.endswith(piece)), None)
        if piece is None:
            continue
        layer = name[:-len(piece)]
        checkpoint_layer = mapping.get(f"{layer}.weight", f"{layer}.weight")[:-len(".weight")]
        yield f"{PEFT_PREFIX}{checkpoint_layer}{ADAPTER_PIECES[piece]}", full_tensor(tensor).detach()


def write_adapter(policy: nn.Module, lora: LoraConfig, directory: Path) -> Path:
    """Save the actor's adapter as a PEFT adapter directory vLLM loads (`adapter_config.json`, safetensors)."""
    from safetensors.torch import save_file

    tensors = {name: tensor.contiguous().cpu() for name, tensor in adapter_tensors(policy)}
    if not tensors:
        raise ValueError("rollout.vllm.lora_sync: adapter, but the actor has no LoRA weights to push")
    directory.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(directory / "adapter_model.safetensors"))
    config = {"peft_type": "LORA", "r": lora.r, "lora_alpha": lora.alpha, "target_modules": lora.target_modules,
              "bias": "none", "lora_dropout": 0.0}
    (directory / "adapter_config.json").write_text(json.dumps(config))
    return directory


class AdapterPush:
    """Loads the actor's adapter into a vLLM engine at each sync; `request` is what sampling passes to vLLM.

    Args:
        llm: The engine (`vllm.LLM`), started with `engine_lora_options(lora)`.
        lora: The actor's `model.lora`.
    """

    def __init__(self, llm: Any, lora: LoraConfig) -> None:
        self.llm = llm
        self.lora = lora
        self.request: Any = None  # the base model alone until the first sync (a fresh adapter adds nothing)
        self.pushes = 0

    def push(self, policy: nn.Module) -> None:
        """Load `policy`'s current adapter under a new id and drop the previous one."""
        from vllm.lora.request import LoRARequest

        scratch = Path(tempfile.mkdtemp(prefix="alignflow-adapter-"))
        try:
            path = write_adapter(policy, self.lora, scratch)
            self.pushes += 1
            request = LoRARequest(lora_name=f"policy-{self.pushes}", lora_int_id=self.pushes, lora_path=str(path))
            if not self.llm.llm_engine.add_lora(request):
                raise RuntimeError(f"vLLM refused the actor's LoRA adapter (push {self.pushes})")
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        if self.request is not None:
            self.llm.llm_engine.remove_lora(self.request.lora_int_id)
        self.request = request

