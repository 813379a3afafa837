"""`rollout.engine: vllm`: vLLM's offline engine samples the responses, and the actor's weights are pushed into it.

The engine runs inside the trainer's process (vLLM's single-process mode: `VLLM_ENABLE_V1_MULTIPROCESSING=0`,
`distributed_executor_backend="uni"`), so nothing crosses a process boundary: prompts go in as token ids
(`TokensPrompt`, no re-tokenising, vLLM's tokenizer never loaded), and weights go in as tensors.

- **Sampling.** One request per run of identical consecutive prompts, with `n` = the run's length (GRPO's
  groups: the prompt is prefilled once), and the `generation` section's temperature, top-p, top-k, max new
  tokens and stop token ids. Each request's `seed` is drawn from torch's generator, which the stages seed
  per rank and checkpoint, so a resumed run samples what an uninterrupted one would, and the explorer's
  batches what its per-batch seed says. vLLM's chunked prefill is off: with a seed, a prompt split across
  steps crashes the CPU build ("CPU Generator does not use offset") once a batch's prompts exceed
  `max_num_batched_tokens`. Each sampled token's log-prob comes back under the untempered softmax
  (`logprobs_mode="raw_logprobs"`), what the trainer's `response_logps` computes.
- **Weight sync.** `sync_from(actor)` streams the actor's weights (`trainer.rollout.weight_stream`:
  checkpoint names, FSDP2 shards gathered one tensor at a time, LoRA merged) into vLLM's `reload_weights`
  through `collective_rpc` with a `weights_iterator`: vLLM's model loader runs again on them, including
  the post-load processing (the CPU build repacks linear weights for its oneDNN kernels, which is why the
  model's plain `load_weights` does not work there). In single-process mode the iterator is a Python
  object handed over, never pickled. The prefix cache is reset after each sync. A LoRA actor can push its
  adapter alone instead (`rollout.vllm.lora_sync`, `trainer.rollout.vllm_lora`).
- **Memory.** `rollout.vllm`: `gpu_memory_utilization`, `max_model_len`, `max_num_seqs`, and
  `sleep_between_rollouts` (vLLM's sleep mode, level 1: weights to host memory and KV cache freed after
  each rollout, woken at the next sync or rollout), refused on a platform without it (the CPU). On the CPU
  the KV cache is `cpu_kv_cache_gib` (`kv_cache_memory_bytes`; `gpu_memory_utilization` would reserve that
  fraction of the host's memory there).
- **Threads (CPU).** In single-process mode vLLM binds no OpenMP threads to cores (its binding,
  `VLLM_CPU_OMP_THREADS_BIND`, is done for worker processes), but its CPU worker replaces
  `torch.set_num_threads` with a no-op for the whole process, which would freeze the trainer's thread
  settings: the real function is put back once the engine has started. The engine samples with the
  process's threads (`train.num_threads`) or `rollout.num_threads` where set, as `hf` does.

One engine per process, tensor parallel size 1: under torchrun every rank samples its own rows with its own
engine, as with `hf`.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from trainer.checkpointing.rng_state import capture_rng_state, restore_rng_state
from trainer.config import GenerationConfig, LoraConfig, RolloutConfig
from trainer.errors import ConfigError
from trainer.rollout.engines import EngineSetup, RolloutEngine, SampledResponses, cpu_threads, sampling_threads
from trainer.rollout.vllm_lora import AdapterPush, engine_lora_options, uses_adapter
from trainer.rollout.vllm_sampling import sampled_logps, sampling_params
from trainer.rollout.weight_stream import checkpoint_weights

logger = logging.getLogger(__name__)

# vLLM reads this when its engine starts: the engine core in this process (no pickling, tensors handed over).
ENGINE_ENVIRONMENT = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
GIB = 1 << 30


def resolve_dtype(dtype: str) -> str:
    """`rollout.vllm.dtype`, `auto` resolved: bfloat16 on a CUDA device that supports it, else float32."""
    if dtype != "auto":
        return dtype
    return "bfloat16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "float32"


def is_eager(enforce_eager: bool | None) -> bool:
    """`rollout.vllm.enforce_eager`, null resolved: eager on the CPU, where compiling costs more than it saves."""
    if enforce_eager is not None:
        return enforce_eager
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def cpu_head_size_problem(config: dict[str, Any]) -> str | None:
    """Why vLLM's CPU attention cannot run a model with this HF config (it takes head sizes 32, 64, 80, ...; an
    unsupported one would fail deep inside the first rollout), or None. Imports vLLM."""
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    head_size = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    supported = CPUAttentionBackend.get_supported_head_sizes()
    if head_size in supported:
        return None
    return (f"vLLM's CPU attention has no head size {head_size} (hidden_size / num_attention_heads; it supports "
            f"{', '.join(map(str, supported))})")


def check_head_size(model_dir: str) -> None:
    """ConfigError when vLLM's CPU attention cannot run the model in `model_dir` (`cpu_head_size_problem`)."""
    import json

    problem = cpu_head_size_problem(json.loads((Path(model_dir) / "config.json").read_text()))
    if problem is not None:
        raise ConfigError(f"rollout.engine: vllm: {model_dir}: {problem}; sample it with `hf`, or on a GPU")


def start_engine(model_dir: str, config: RolloutConfig, seed: int, lora: LoraConfig | None = None) -> Any:
    """vLLM's `LLM` on `model_dir`'s config and weights, in this process, with the `rollout.vllm` settings; with
    `lora`, room for one adapter of its rank (`trainer.rollout.vllm_lora`)."""
    options = config.vllm
    for name, value in ENGINE_ENVIRONMENT.items():
        os.environ[name] = value
    from vllm import LLM
    from vllm.platforms import current_platform

    if options.sleep_between_rollouts and not current_platform.is_sleep_mode_available():
        raise ConfigError(f"rollout.vllm.sleep_between_rollouts is true but vLLM's {current_platform.device_type} "
                          "platform has no sleep mode; set it to false")
    if current_platform.is_cpu():
        check_head_size(model_dir)
    # On the CPU, gpu_memory_utilization would reserve that fraction of the host's memory: size the KV cache instead.
    memory = ({"kv_cache_memory_bytes": int(options.cpu_kv_cache_gib * GIB)} if current_platform.is_cpu()
              else {"gpu_memory_utilization": options.gpu_memory_utilization})
    # The CPU worker replaces torch.set_num_threads with a no-op for the whole process; the trainer shares the
    # process and sets its threads (`train.num_threads`, `rollout.num_threads`), so the real one is put back.
    # The worker also reseeds Python's, numpy's and torch's generators, which are the run's (seeded per rank,
    # checkpointed): their state is put back too.
    set_num_threads, num_threads = torch.set_num_threads, torch.get_num_threads()
    generators = capture_rng_state()
    # vLLM runs a full garbage collection five times while it starts (model loading, then freezing the heap),
    # each a walk over every object the trainer's imports and models made: 1 s of a 6.7 s start here. Frozen
    # first, those objects are skipped; vLLM freezes the whole heap when it has started anyway.
    gc.freeze()
    try:
        return LLM(model=model_dir, skip_tokenizer_init=True, dtype=resolve_dtype(options.dtype), seed=seed,
                   max_model_len=options.max_model_len, max_num_seqs=options.max_num_seqs,
                   enforce_eager=is_eager(options.enforce_eager), enable_sleep_mode=options.sleep_between_rollouts,
                   distributed_executor_backend="uni", enable_chunked_prefill=False, logprobs_mode="raw_logprobs",
                   max_logprobs=0, **memory, **(engine_lora_options(lora) if lora else {}))
    finally:
        torch.set_num_threads = set_num_threads
        torch.set_num_threads(num_threads)
        restore_rng_state(generators)


def prompt_groups(prompt_ids: Tensor, prompt_mask: Tensor) -> list[tuple[list[int], int]]:
    """(token ids without padding, count) for each run of identical consecutive prompts, in order."""
    groups: list[tuple[list[int], int]] = []
    for ids, mask in zip(prompt_ids.tolist(), prompt_mask.tolist()):
        tokens = [token for token, keep in zip(ids, mask) if keep]
        if groups and groups[-1][0] == tokens:
            groups[-1] = (tokens, groups[-1][1] + 1)
        else:
            groups.append((tokens, 1))
    return groups


def right_pad(rows: list[list[Any]], value: Any, dtype: torch.dtype) -> Tensor:
    """(B, R) of `rows` right-padded with `value`, R the longest row (at least 1)."""
    width = max(1, *(len(row) for row in rows))
    return torch.tensor([row + [value] * (width - len(row)) for row in rows], dtype=dtype)


class VLLMEngine(RolloutEngine):
    """Samples with vLLM's offline engine on its own copy of the policy's weights.

    Args:
        config: The `rollout` section (`vllm` settings).
        setup: Where the weights start (`model_path`, local or URI), the engine's seed, the LoRA scale.
    """

    def __init__(self, config: RolloutConfig, setup: EngineSetup) -> None:
        from vllm.platforms import current_platform

        from trainer.storage.transfer import cached_copy

        self.lora_scale = setup.lora_scale
        pushes_adapter = uses_adapter(config.vllm, setup.lora, on_cpu=current_platform.is_cpu())
        self.sleeps = config.vllm.sleep_between_rollouts
        self.num_threads = config.num_threads
        self.is_asleep = False
        # vLLM sets up torch.distributed (a group of one) unless the trainer already has; close() undoes its own.
        self.owns_process_group = not torch.distributed.is_initialized()
        started = time.perf_counter()
        self.llm = start_engine(str(cached_copy(setup.model_path)), config, setup.seed,
                                setup.lora if pushes_adapter else None)
        logger.info("vLLM engine started on %s in %.1f s", setup.model_path, time.perf_counter() - started)
        # With LoRA pushed as an adapter, syncs load it and requests name it; otherwise full weights are pushed.
        self.adapter = AdapterPush(self.llm, setup.lora) if pushes_adapter else None
        if pushes_adapter:
            logger.info("each weight sync pushes the LoRA adapter alone (rollout.vllm.lora_sync)")

    @torch.no_grad()
    def generate(self, prompt_ids: Tensor, prompt_mask: Tensor, options: GenerationConfig, *,
                 stop_token_ids: list[int], pad_token_id: int) -> SampledResponses:
        from vllm.inputs import TokensPrompt

        self.wake_up()
        groups = prompt_groups(prompt_ids, prompt_mask)
        seeds = torch.randint(0, 2**31 - 1, (len(groups),)).tolist()  # from the run's seeded, checkpointed generator
        prompts = [TokensPrompt(prompt_token_ids=tokens) for tokens, _ in groups]
        params = [sampling_params(options, stop_token_ids, count, seed) for (_, count), seed in zip(groups, seeds)]
        threads = sampling_threads(self.num_threads, len(prompt_ids))
        with cpu_threads(threads if prompt_ids.device.type == "cpu" else None):
            outputs = self.llm.generate(prompts, params, use_tqdm=False,
                                        lora_request=self.adapter.request if self.adapter else None)
        completions = [completion for output in outputs for completion in output.outputs]  # rows, in order
        self.fall_asleep()
        ids = right_pad([list(c.token_ids) for c in completions], pad_token_id, torch.long)  # (B, R)
        logps = right_pad([sampled_logps(c) for c in completions], 0.0, torch.float32)  # (B, R)
        return SampledResponses(ids.to(prompt_ids.device), logps.to(prompt_ids.device))

    @contextlib.contextmanager
    def turn_stream(self, options: GenerationConfig, *, stop_token_ids: list[int],
                    num_rows: int) -> Iterator[Any]:
        """Turns batched continuously (`trainer.rollout.vllm_turns`), with the threads a `generate` call of
        `num_rows` rows would take; turns still in flight at the end are aborted."""
        from vllm.platforms import current_platform

        from trainer.rollout.vllm_turns import TurnStream

        self.wake_up()
        stream = TurnStream(self.llm, options, stop_token_ids, self.adapter.request if self.adapter else None)
        threads = sampling_threads(self.num_threads, num_rows)
        try:
            with cpu_threads(threads if current_platform.is_cpu() else None):
                yield stream
        finally:
            stream.abort()
            self.fall_asleep()

    def sync_from(self, policy: nn.Module) -> None:
        if self.adapter is not None:
            self.wake_up()
            self.adapter.push(policy)
        else:
            self.push(checkpoint_weights(policy, self.lora_scale))

    def push(self, weights: Iterable[tuple[str, Tensor]]) -> None:
        """Reload the engine's model from `weights` ((checkpoint name, tensor) pairs), repacked as vLLM loads them."""
        self.wake_up()
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(weights)})
        self.llm.reset_prefix_cache()  # cached prompt KV was computed by the old weights

    def wake_up(self) -> None:
        if self.is_asleep:
            self.llm.wake_up()
            self.is_asleep = False

    def fall_asleep(self) -> None:
        """After a rollout: hand the GPU memory back to the trainer (`sleep_between_rollouts`)."""
        if self.sleeps:
            self.llm.sleep(level=1)
            self.is_asleep = True

    def close(self) -> None:
        """Shut the engine down and free its memory, so that another engine can start in this process (the
        evaluation samples each model with its own); the trainer's own process group is left alone."""
        llm, self.llm = self.llm, None
        if llm is not None:
            shut_down(llm, self.owns_process_group)
            del llm
            gc.collect()


def shut_down(llm: Any, owns_process_group: bool) -> None:
    """Shut `llm`'s in-process engine down and undo vLLM's distributed state.

    vLLM's engine-core shutdown tears torch.distributed down as if it had set it up; under torchrun the
    trainer did, and still needs it (the next model's evaluation, the end-of-run collectives). There its
    teardown is narrowed to vLLM's own groups (its model-parallel groups and its world group).
    """
    import vllm.distributed.parallel_state as parallel_state
    import vllm.v1.engine.core as engine_core

    if owns_process_group:
        llm.llm_engine.engine_core.shutdown()
        return

    def release_vllm_groups(*args: Any, **kwargs: Any) -> None:
        parallel_state.destroy_model_parallel()
        if parallel_state._WORLD is not None:
            parallel_state._WORLD.destroy()
            parallel_state._WORLD = None

    cleanup = engine_core.cleanup_dist_env_and_memory
    engine_core.cleanup_dist_env_and_memory = release_vllm_groups
    try:
        llm.llm_engine.engine_core.shutdown()
    finally:
        engine_core.cleanup_dist_env_and_memory = cleanup
