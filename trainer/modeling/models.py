"""Loading models and tokenizers from local paths, the value-head wrapper, LoRA and HF export.

Models load from local directories only (`local_files_only=True`): nothing is fetched at run time.
A directory without a tokenizer or weights, or with weights that do not load, is a one-line
`ConfigError` naming the directory (and the file when one is at fault). A reward model or critic
keeps its trained head, from alignflow's export or a `*ForSequenceClassification` directory (see
`trainer.modeling.value_heads`); a reward model without one is an error.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors.torch import save_file
from torch import nn

from trainer.compat import dtype_keyword
from trainer.config import ModelConfig
from trainer.errors import ConfigError

if TYPE_CHECKING:
    from trainer.parallel.booster import Plugin
from trainer.modeling import value_heads
from trainer.modeling.lean_activations import use_lean_activations
from trainer.modeling.sharded_load import build_on_meta, can_load_sharded, materialize_shards, plan_reads
from trainer.modeling.value_heads import find_value_head
from trainer.storage.local import give_default_mode

logger = logging.getLogger(__name__)

VALUE_HEAD_FILE = value_heads.VALUE_HEAD_FILE
VALUE_HEAD_MARKER = "alignflow_value_model.json"
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
# Keys whose directory is used to score: it must bring its trained head (never a random one).
REWARD_MODEL_KEYS = ("reward.model_path",)


def _first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


def _check_weights(directory: Path, key: str) -> None:
    if not any((directory / name).is_file() for name in WEIGHT_FILES):
        raise ConfigError(f"{key}: {directory} has no weights (expected one of {', '.join(WEIGHT_FILES)})")


def _from_pretrained(load: Callable[..., Any], directory: Path, key: str, **kwargs: Any) -> Any:
    """`load(directory, ...)` with missing or damaged weights turned into one ConfigError naming them."""
    from safetensors import SafetensorError

    _check_weights(directory, key)
    try:
        return load(str(directory), local_files_only=True, **kwargs)
    except (OSError, ValueError, RuntimeError, EOFError, SafetensorError) as err:
        files = ", ".join(name for name in WEIGHT_FILES if (directory / name).is_file())
        raise ConfigError(f"{key}: cannot load the weights in {directory} ({files}): {_first_line(err)}") from err


def _check_path(path: str, key: str = "model.path") -> Path:
    """The local directory of a model given by path or `s3://` URI (downloaded once into the cache)."""
    from trainer.storage.transfer import cached_copy

    directory = cached_copy(path)
    if not (directory / "config.json").is_file():
        raise ConfigError(f"{key}: {path} is not a local Hugging Face model directory (no config.json)")
    _check_model_config(directory / "config.json", key)
    return directory


def _check_model_config(config_file: Path, key: str) -> None:
    """ConfigError naming `config.json` when it cannot be read: the tokenizer reads it first, and would be blamed."""
    from transformers import AutoConfig

    try:
        if not isinstance(json.loads(config_file.read_bytes()), dict):
            raise ConfigError(f"{key}: {config_file}: expected a JSON object")
    except (ValueError, OSError) as err:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ConfigError(f"{key}: {config_file}: not valid JSON: {err}") from err
    try:
        AutoConfig.from_pretrained(str(config_file.parent), local_files_only=True)
    except (OSError, ValueError, KeyError, TypeError) as err:  # e.g. a model_type transformers does not know
        raise ConfigError(f"{key}: {config_file}: not a usable model config: {_first_line(err)}") from err


def load_tokenizer(path: str) -> Any:
    """The tokenizer saved beside the model; a pad token is borrowed from EOS if it has none."""
    from transformers import AutoTokenizer

    directory = _check_path(path)
    if not any((directory / name).is_file() for name in TOKENIZER_FILES):
        raise ConfigError(f"model.path: {directory} has no tokenizer (expected {' or '.join(TOKENIZER_FILES[:2])}); "
                          "save the tokenizer beside the model")
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    except (OSError, ValueError, TypeError, KeyError) as err:
        raise ConfigError(f"model.path: cannot load the tokenizer in {directory}: {_first_line(err)}") from err
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_causal_lm(config: ModelConfig, path: str | None = None, key: str = "model.path",
                   plugin: Plugin | None = None) -> nn.Module:
    """An `AutoModelForCausalLM` from `path` (default `config.path`), with the config's options applied.

    Args:
        config: Model options (attention kernel, gradient checkpointing, LoRA).
        path: Directory to load instead of `config.path` (e.g. a DPO reference).
        key: The config key `path` came from, named in errors.
        plugin: With one that shards parameters (FSDP2), the model is built on the meta device,
            sharded, and each rank reads only its slices of the weights (`trainer.modeling.sharded_load`);
            it comes back wrapped, on the plugin's device, and `Booster.boost` leaves it as it is.

    Returns:
        The model in fp32: on CPU, or sharded as above.
    """
    from transformers import AutoModelForCausalLM

    directory = _check_path(path or config.path, key)
    options = {"attn_implementation": config.attn_implementation, **dtype_keyword(torch.float32)}
    if _shards_parameters(plugin, directory, key):
        model = build_on_meta(AutoModelForCausalLM, directory, **options)
        reads = _plan_or_log(model, directory, key)
        if reads is not None:
            model = _apply_options(model, config, plugin)
            return materialize_shards(model, plugin.wrap_model, plugin.device, directory, key, reads)
    model = _from_pretrained(AutoModelForCausalLM.from_pretrained, directory, key, **options)
    return _apply_options(model, config, plugin)


def _shards_parameters(plugin: Plugin | None, directory: Path, key: str) -> bool:
    """Whether to load into shards: a plugin that shards, safetensors weights and a torch that reads them."""
    if plugin is None or not plugin.shards_parameters:
        return False
    if can_load_sharded(directory):
        return True
    logger.info("%s: %s has no safetensors weights (or torch has no DCP HF reader): every rank loads it whole",
                key, directory)
    return False


def _plan_or_log(model: nn.Module, directory: Path, key: str, keep: tuple[str, ...] = ()) -> dict[str, str] | None:
    reads = plan_reads(model, directory, key, keep)
    if reads is None:
        logger.info("%s: %s converts tensors on load (merged or split, or stored buffers), which cannot be read "
                    "in slices: every rank loads it whole", key, directory)
    return reads


def load_value_model(config: ModelConfig, path: str | None = None, key: str = "model.path",
                     plugin: Plugin | None = None) -> ValueHeadModel:
    """A causal LM backbone with a scalar head: the trained head of an alignflow export or a
    `*ForSequenceClassification` directory, else a new one (an error for `reward.model_path`).

    Args:
        config: Model options.
        path: Directory to load instead of `config.path` (a reward model, a critic init).
        key: The config key `path` came from, named in errors.
        plugin: With one that shards parameters (FSDP2), the backbone loads straight into shards as in
            `load_causal_lm` (the small head is read whole, then sharded with it).

    Returns:
        The value model in fp32: on CPU, or sharded and on the plugin's device.
    """
    from transformers import AutoModel

    directory = _check_path(path or config.path, key)
    options = {"attn_implementation": config.attn_implementation, **dtype_keyword(torch.float32)}
    reads = None
    if _shards_parameters(plugin, directory, key):
        model = ValueHeadModel(build_on_meta(AutoModel, directory, **options))
        reads = _plan_or_log(model, directory, key, keep=("head.",))
    if reads is None:
        model = ValueHeadModel(_from_pretrained(AutoModel.from_pretrained, directory, key, **options))
    is_reward_model = key in REWARD_MODEL_KEYS or key.startswith(("reward.sources.", "--model"))  # a new head: noise
    head = find_value_head(directory, model.config.hidden_size, key, required=is_reward_model)
    if head is not None:
        model.head.load_state_dict(head)
    else:
        logger.info("%s: %s has no value head; starting from a new one", key, directory)
    model = _apply_options(model, config, plugin)
    if reads is not None:
        return materialize_shards(model, plugin.wrap_model, plugin.device, directory, key, reads, keep=("head.",))
    return model


def load_frozen(loader: Callable[..., nn.Module], config: ModelConfig, device: torch.device, path: str | None = None,
                key: str = "model.path", plugin: Plugin | None = None) -> nn.Module:
    """A model that is only read (a reference, a reward model): loaded by `loader` (`load_causal_lm` or
    `load_value_model`) without LoRA or activation checkpointing, with no gradients, in eval mode, on `device`.

    With an FSDP2 `plugin` it is sharded like the trained model: each rank holds
    1/world of it, and every forward all-gathers one layer at a time, so every rank must run the same
    number of forwards through it (a collective), as the training step does.
    """
    plain = config.model_copy(update={"lora": None, "gradient_checkpointing": False})
    model = loader(plain, path, key=key, plugin=plugin).requires_grad_(False).eval()
    return model if plugin is not None and plugin.is_wrapped(model) else model.to(device)


def _apply_options(model: nn.Module, config: ModelConfig, plugin: Plugin | None = None) -> nn.Module:
    if config.lean_activations and not (plugin is not None and plugin.rewrites_modules):
        use_lean_activations(model)
    if config.gradient_checkpointing:
        target = model.backbone if isinstance(model, ValueHeadModel) else model
        enable_activation_checkpointing(target)
        target.config.use_cache = False
    if config.lora is not None:
        model = apply_lora(model, config)
    return model


def enable_activation_checkpointing(model: nn.Module) -> None:
    """Recompute each decoder layer in backward (transformers 5 renamed the method; 4.x has the old name)."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def apply_lora(model: nn.Module, config: ModelConfig) -> nn.Module:
    """Freeze the model and add LoRA adapters (PEFT) to `config.lora.target_modules`."""
    try:
        from peft import LoraConfig as PeftLoraConfig
        from peft import inject_adapter_in_model
    except ImportError as err:
        raise ConfigError("model.lora is set but peft is not installed; install the `lora` extra") from err
    lora = config.lora
    peft_config = PeftLoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                                 target_modules=lora.target_modules)
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    try:
        model = inject_adapter_in_model(peft_config, model)
    except ValueError as err:  # peft's "target modules not found"
        raise ConfigError(f"model.lora.target_modules {lora.target_modules} matched no module of {config.path}") from err
    if isinstance(model, ValueHeadModel):
        model.head.requires_grad_(True)  # a fresh head must always train
    return model


LORA_PIECES = (".lora_A.default.weight", ".lora_B.default.weight", ".base_layer.weight")


def merged_lora_name(name: str) -> str | None:
    """The name a state-dict entry has once LoRA is merged (`q_proj.base_layer.weight` -> `q_proj.weight`);
    None for an adapter matrix, which is folded into its base weight."""
    if ".lora_" in name:
        return None
    return name.replace(".base_layer.", ".")


def merge_lora_weights(weights: Iterable[tuple[str, torch.Tensor]],
                       alpha_over_r: float | None) -> Iterator[tuple[str, torch.Tensor]]:
    """(merged name, tensor) for each entry of `weights`, in order: a LoRA layer's base weight and its
    `lora_A`/`lora_B` are held until all three are in, then yielded as one weight W + (alpha / r) B A."""
    pending: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in weights:
        piece = next((suffix for suffix in LORA_PIECES if name.endswith(suffix)), None)
        if piece is None:
            yield merged_lora_name(name), tensor
            continue
        if alpha_over_r is None:
            raise ValueError(f"{name}: the model carries LoRA adapters but no LoRA scale was given to merge them")
        prefix = name.removesuffix(piece)
        pieces = pending.setdefault(prefix, {})
        pieces[piece] = tensor
        if len(pieces) == len(LORA_PIECES):
            del pending[prefix]
            lora_a, lora_b, base = (pieces[suffix] for suffix in LORA_PIECES)
            yield f"{prefix}.weight", base + alpha_over_r * (lora_b.to(base.dtype) @ lora_a.to(base.dtype))
    if pending:  # an adapter without its base weight (or the reverse): not a model `apply_lora` built
        raise ValueError(f"LoRA pieces without their partners in the state dict: {', '.join(sorted(pending))}")


def merge_lora_state(state: dict[str, torch.Tensor], alpha_over_r: float) -> dict[str, torch.Tensor]:
    """Fold `lora_A`/`lora_B` weights into their base linear weights and drop the adapter keys."""
    return dict(merge_lora_weights(state.items(), alpha_over_r))


class ValueHeadModel(nn.Module):
    """A transformer backbone with a linear head giving one scalar per token.

    Used as the reward model (score = value at the last non-pad token) and, later, the PPO critic.
    """

    def __init__(self, backbone: nn.Module) -> None:
        super().__init__()
        self.backbone = backbone
        self.config = backbone.config
        self.head = nn.Linear(backbone.config.hidden_size, 1)
        nn.init.normal_(self.head.weight, std=1.0 / (backbone.config.hidden_size + 1) ** 0.5)
        nn.init.zeros_(self.head.bias)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **kwargs: Any) -> torch.Tensor:
        """Per-token values (B, T)."""
        hidden = self.backbone(input_ids=input_ids, attention_mask=attention_mask, use_cache=False, **kwargs)
        return self.head(hidden.last_hidden_state).squeeze(-1)  # (B, T)



def export_model(model: nn.Module, state: dict[str, torch.Tensor], tokenizer: Any, directory: Path,
                 lora_scale: float | None = None) -> None:
    """Write an HF directory (weights, config, tokenizer) that `from_pretrained` can load.

    Args:
        model: The unwrapped model whose class and config describe `state`.
        state: Full (unsharded) state dict on CPU.
        tokenizer: Saved beside the weights.
        directory: Target directory; created if missing.
        lora_scale: alpha / r when the state holds LoRA adapters, which are merged into the weights.
    """
    if lora_scale is not None:
        state = merge_lora_state(state, lora_scale)
    directory.mkdir(parents=True, exist_ok=True)
    if isinstance(model, ValueHeadModel):
        backbone_state = {k.removeprefix("backbone."): v for k, v in state.items() if k.startswith("backbone.")}
        model.backbone.save_pretrained(directory, state_dict=backbone_state)
        save_file({k: v.contiguous() for k, v in state.items() if k.startswith("head.")}, directory / VALUE_HEAD_FILE)
        (directory / VALUE_HEAD_MARKER).write_text(json.dumps({"head": VALUE_HEAD_FILE}))
    else:
        model.save_pretrained(directory, state_dict=state)
    tokenizer.save_pretrained(directory)
    give_default_mode(directory)  # safetensors writes its files 0600
