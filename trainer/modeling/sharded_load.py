"""Loading a Hugging Face model straight into FSDP2 shards: no rank ever holds the whole model.

A plain `from_pretrained` on every rank costs each rank the full model in fp32 (28 GB for 7B)
before `fully_shard` frees most of it. Here the model is built from its `config.json` with its
parameters on the meta device (no memory, no init work), sharded by the plugin while still empty,
given storage for this rank's slices only (`to_empty`), and filled from the safetensors files by
`torch.distributed.checkpoint`'s Hugging Face reader, which plans each rank's reads from the
tensors' shapes and reads only its slices (`safe_open(...).get_slice`), converting to the
parameters' dtype as it copies. Peak memory per rank is its shard plus one slice being copied.

Buffers (rotary frequencies and the like) are computed in `__init__` and are not in the weights
file, so they are built for real on every rank (they are small) and kept across `to_empty`.
Each parameter is read from the checkpoint key `from_pretrained` would fill it from
(`trainer.modeling.checkpoint_keys`: GPT-NeoX's `embed_out` is the module's `lm_head`, a backbone reads a
`*ForCausalLM` checkpoint without its prefix, a tied head stored under either name); a parameter
with no key is one error naming it and the checkpoint's keys that match nothing.
What it leaves out: `pytorch_model.bin` directories, torch releases without DCP's HF reader, and
checkpoints whose tensors are converted on load (merged experts, split fused projections) or that
store buffers: all load whole, as before, with one logged line; LoRA (rejected with FSDP2 earlier).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trainer.errors import ConfigError
from trainer.modeling.checkpoint_keys import describe_mismatch, map_checkpoint_keys

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Modules built inside get their parameters on the meta device and their buffers for real.

    `torch.device("meta")` would put buffers on meta too, and those computed in `__init__` could
    not be recovered; so, as accelerate's `init_empty_weights(include_buffers=False)` does,
    `nn.Module.register_parameter` is wrapped for the duration of the block (model building is
    single-threaded). Initialisers then run on meta tensors, which costs nothing.
    """
    register = nn.Module.register_parameter

    def register_on_meta(module: nn.Module, name: str, parameter: nn.Parameter | None) -> None:
        register(module, name, parameter)
        if parameter is not None and parameter.device.type != "meta":
            module._parameters[name] = type(parameter)(parameter.to("meta"), requires_grad=parameter.requires_grad)

    nn.Module.register_parameter = register_on_meta
    try:
        yield
    finally:
        nn.Module.register_parameter = register


def can_load_sharded(directory: Path) -> bool:
    """Safetensors weights, and a torch with DCP's Hugging Face reader."""
    import torch.distributed.checkpoint as dcp

    return hasattr(dcp, "HuggingFaceStorageReader") and any(directory.glob("*.safetensors"))


def build_on_meta(auto_class: Any, directory: Path, **kwargs: Any) -> nn.Module:
    """`auto_class` (e.g. `AutoModelForCausalLM`) from `directory`'s config.json, parameters on meta."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(directory), local_files_only=True)
    with parameters_on_meta():
        return auto_class.from_config(config, **kwargs)


def weight_names(directory: Path) -> set[str]:
    """The tensor names in `directory`'s safetensors files (headers only)."""
    from safetensors import safe_open

    names: set[str] = set()
    for path in sorted(directory.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as weights:
            names.update(weights.keys())
    return names


def _pretrained_parts(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """`model` itself when it is a transformers model, else its transformers children with their name
    prefixes (a value model's `backbone.`): the parts whose names a checkpoint's keys map onto."""
    from transformers import PreTrainedModel

    if isinstance(model, PreTrainedModel):
        return [("", model)]
    return [(f"{name}.", child) for name, child in model.named_children() if isinstance(child, PreTrainedModel)]


def plan_reads(model: nn.Module, directory: Path, key: str, keep: tuple[str, ...] = ()) -> dict[str, str] | None:
    """The checkpoint key to read into each parameter of a meta-device `model`, matched as `from_pretrained`
    matches them (`trainer.modeling.checkpoint_keys`): renamed heads, base-model prefixes, tied weights.

    Args:
        model: Unwrapped and still on meta (the names are the module's own, before sharding).
        directory: The model directory.
        key: The config key it came from, named in errors.
        keep: Name prefixes of parameters that are not read (they already hold their values).

    Returns:
        Parameter name -> checkpoint key for every parameter not under `keep`, or None when the
        checkpoint needs a tensor conversion on load (or stores a buffer), which cannot be read in slices.

    Raises:
        ConfigError: Some parameter has no tensor in the checkpoint (naming it, and the checkpoint's
            tensors that match nothing).
    """
    names = weight_names(directory)
    plan: dict[str, str] = {}
    unmatched = set(names)
    for prefix, part in _pretrained_parts(model):
        keys = map_checkpoint_keys(part, names)
        parameters = {name for name, _ in part.named_parameters(remove_duplicate=False)}
        buffers = set(part.state_dict(keep_vars=True)) - parameters  # persistent ones
        if keys.converted or buffers & keys.sources.keys():
            return None
        plan |= {prefix + name: source for name, source in keys.sources.items()}
        unmatched &= set(keys.unmatched)
    # named_parameters lists a tied weight once (under its first name): one read fills both names.
    wanted = [name for name, _ in model.named_parameters() if not name.startswith(keep)]
    missing = [name for name in wanted if name not in plan]
    if missing:
        raise ConfigError(f"{key}: the weights in {directory} {describe_mismatch(missing, sorted(unmatched))}")
    return {name: plan[name] for name in wanted}


def materialize_shards(model: nn.Module, wrap: Any, device: torch.device, directory: Path, key: str,
                       reads: dict[str, str], keep: tuple[str, ...] = ()) -> nn.Module:
    """Shard a meta-device `model` with `wrap` (FSDP2's `fully_shard` per layer and root), give each rank
    storage for its slices on `device`, and read them from `directory`'s safetensors files (a collective).

    Args:
        model: Parameters on meta, except those under a `keep` prefix (small ones, e.g. a value head,
            already holding their values on every rank).
        wrap: Shards the model in place and returns it.
        device: Where this rank's slices live.
        directory: The model directory.
        key: The config key it came from, named in errors.
        reads: Parameter name -> checkpoint key, for every parameter not under `keep` (`plan_reads`).
        keep: Name prefixes of parameters whose current values are kept rather than read from the files.

    Returns:
        The wrapped model with its weights, on `device`.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    buffers = {name: buffer.detach().clone() for name, buffer in model.named_buffers()}
    kept = {name: parameter.detach().clone() for name, parameter in model.named_parameters() if name.startswith(keep)}
    model = wrap(model)
    model.to_empty(device=device)  # parameters: this rank's slices, uninitialised; buffers: emptied too
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            buffer.copy_(buffers[name])
    # Sharding keeps the parameters' names; DCP's reader is keyed by the checkpoint's.
    state = {reads[name]: parameter for name, parameter in model.named_parameters() if name not in kept}
    try:
        dcp.load(state, storage_reader=dcp.HuggingFaceStorageReader(str(directory)))
    except (CheckpointException, RuntimeError, ValueError) as err:
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise ConfigError(f"{key}: cannot load the weights in {directory} into shards: {first}") from err
    if kept:  # every rank holds them whole: each keeps its own slice
        set_model_state_dict(model, kept, options=StateDictOptions(full_state_dict=True, strict=False))
    logger.info("%s: loaded %s into shards (meta-device build, each rank reads its slices)", key, directory)
    return model
