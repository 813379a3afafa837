"""The actor's weights as a reader of checkpoints expects them, one full tensor at a time.

A rollout engine that keeps its own copy of the weights (vLLM) loads them as it loads a Hugging Face
checkpoint: by checkpoint name (`to_checkpoint_names`, what `save_pretrained` writes), whole, with
LoRA adapters merged into their base weights. `checkpoint_weights` yields them so, from any actor
the stages train:

- plain or DDP-wrapped: the module's own tensors, renamed;
- FSDP2-sharded: each DTensor gathered (`full_tensor`, a collective every rank runs in the same
  order) just before it is yielded, so a sync holds one gathered tensor at a time beside the shards,
  never the whole model;
- with LoRA: a layer's base weight and its `lora_A`/`lora_B` are held until all three are there, then
  yielded as one merged weight, W + (alpha / r) B A (`trainer.modeling.models.merge_lora_weights`, which
  the exported model is merged with too); nothing in the actor changes.

Names are worked out once per sync from placeholders on the meta device. A model whose conversion
mapping converts tensors rather than renaming them (merged or split experts) cannot be renamed one
tensor at a time: its full state is gathered first and converted whole.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor, nn

from trainer.modeling.checkpoint_keys import to_checkpoint_names
from trainer.modeling.models import merge_lora_weights, merged_lora_name
from trainer.parallel.booster import unwrap_model


def checkpoint_name_map(model: nn.Module, names: list[str]) -> dict[str, str] | None:
    """Module name -> checkpoint name for each of `names` (merged names), or None when the model's
    conversion mapping converts tensors (they then have to be converted whole)."""
    placeholders = {name: torch.empty(0, device="meta") for name in names}
    converted = to_checkpoint_names(model, placeholders)
    origin = {id(tensor): name for name, tensor in placeholders.items()}
    if any(id(tensor) not in origin for tensor in converted.values()):
        return None
    return {origin[id(tensor)]: checkpoint for checkpoint, tensor in converted.items()}


def full_tensor(tensor: Tensor) -> Tensor:
    """`tensor` whole: a DTensor (FSDP2 shard) is all-gathered, a collective every rank must run."""
    from torch.distributed.tensor import DTensor

    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def merged_weights(model: nn.Module, lora_scale: float | None) -> Iterator[tuple[str, Tensor]]:
    """(merged name, full tensor) in state-dict order, each gathered only when it is reached."""
    whole = ((name, full_tensor(tensor).detach()) for name, tensor in model.state_dict().items())
    return merge_lora_weights(whole, lora_scale)


def checkpoint_weights(policy: nn.Module, lora_scale: float | None = None) -> Iterator[tuple[str, Tensor]]:
    """The policy's weights as (checkpoint name, full tensor), one at a time (see the module docstring).

    Args:
        policy: The actor, possibly DDP-wrapped or FSDP2-sharded; every rank of a sharded actor must
            consume the iterator to its end, in step.
        lora_scale: alpha / r when the actor carries LoRA adapters (to merge); None otherwise.

    Yields:
        (checkpoint name, tensor) pairs; tensors stay on the actor's device and dtype.
    """
    model = unwrap_model(policy)
    names = [merged for name in model.state_dict() if (merged := merged_lora_name(name)) is not None]
    mapping = checkpoint_name_map(model, names)
    if mapping is None:  # conversions act on several tensors at once: gather and convert whole
        yield from to_checkpoint_names(model, dict(merged_weights(model, lora_scale))).items()
        return
    for name, tensor in merged_weights(model, lora_scale):
        yield mapping[name], tensor
