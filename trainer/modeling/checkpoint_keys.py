"""Checkpoint tensor names and a model's parameter names, matched the way transformers matches them.

A Hugging Face checkpoint does not always name its tensors as the module that loads it names its
parameters: GPT-NeoX (and Pythia) checkpoints call the head `embed_out` while the module calls it
`lm_head`; a base model (`AutoModel`, the backbone of a reward model) reads a `*ForCausalLM`
checkpoint whose names carry the base-model prefix (`model.`, `transformer.`, `gpt_neox.`); a tied
head may be stored under either of its names; older checkpoints of some families use old names
(`LayerNorm.gamma`). `from_pretrained` renames checkpoint keys with transformers' conversion mapping
(`transformers.conversion_mapping.get_model_conversion_mapping`, applied by
`transformers.core_model_loading.rename_source_key`), and `save_pretrained` reverts it
(`revert_weight_conversion`). Anything here that reads weights by name (the FSDP2 sharded loader,
the head of a sequence classifier) calls `map_checkpoint_keys`, so it reads what `from_pretrained`
would; anything that hands weights to a reader of checkpoints (a rollout engine's weight sync, e.g.
vLLM's `load_weights` or `reload_weights`) calls `to_checkpoint_names`, so it writes what
`save_pretrained` would. Both call transformers' own functions rather than keeping a table.

Some mappings convert tensors instead of renaming them (mixture-of-experts checkpoints that store
each expert apart, fused projections split on load): those keys come back in `converted`, and a
reader that can only copy slices (the sharded loader) loads such a model whole instead.

With transformers releases before the conversion mapping (4.x, e.g. ColossalAI's pin 4.51.3) the
names are matched as they are, only the base-model prefix added or stripped: those releases kept
the checkpoints' names on the modules (GPT-NeoX's head was still `embed_out`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor, nn


@dataclass(slots=True)
class CheckpointKeys:
    """How a checkpoint's tensors map onto a model.

    Attributes:
        sources: Model tensor name (parameter or persistent buffer, as in `state_dict()`) -> the
            checkpoint key holding it. Both names of a tied pair map to the stored one.
        unmatched: Checkpoint keys no tensor of the model takes (a head the model does not have, or
            a name nothing renames).
        converted: Checkpoint keys that only load through a tensor conversion (merged, split).
    """

    sources: dict[str, str] = field(default_factory=dict)
    unmatched: list[str] = field(default_factory=list)
    converted: list[str] = field(default_factory=list)

    def missing(self, names: Iterable[str]) -> list[str]:
        """The `names` no checkpoint key provides."""
        return [name for name in names if name not in self.sources]


def _conversions(model: nn.Module) -> tuple[list[Any], list[Any]] | None:
    """`from_pretrained`'s renamings and converters for `model`; None before transformers had them."""
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightConverter, WeightRenaming
    except ImportError:
        return None
    transforms = get_model_conversion_mapping(model)
    return ([t for t in transforms if isinstance(t, WeightRenaming)],
            [t for t in transforms if isinstance(t, WeightConverter)])


def _with_prefix_fixed(key: str, prefix: str, targets: Mapping[str, Any]) -> str:
    """`key` with the base-model prefix stripped or added where only that form is a model tensor."""
    if prefix and key.startswith(f"{prefix}.") and key.removeprefix(f"{prefix}.") in targets:
        return key.removeprefix(f"{prefix}.")
    if prefix and f"{prefix}.{key}" in targets:
        return f"{prefix}.{key}"
    return key


def _rename(key: str, model: nn.Module, conversions: tuple[list[Any], list[Any]] | None,
            targets: Mapping[str, Any]) -> tuple[str, bool]:
    """A checkpoint key's model name and whether a converter (not a plain rename) produces it."""
    prefix = getattr(model, "base_model_prefix", "") or ""
    if conversions is None:
        return _with_prefix_fixed(key, prefix, targets), False
    from transformers.core_model_loading import rename_source_key

    renamings, converters = conversions
    renamed, pattern = rename_source_key(key, renamings, converters, prefix, targets)
    if renamed not in targets and key in targets:  # as from_pretrained: a rename that misses falls back
        renamed, pattern = rename_source_key(key, [], [], prefix, targets)
    return renamed, pattern is not None


def map_checkpoint_keys(model: nn.Module, checkpoint_keys: Iterable[str]) -> CheckpointKeys:
    """Which checkpoint key fills each tensor of `model`, as `from_pretrained` decides it.

    Args:
        model: A transformers `PreTrainedModel` (parameters may be on the meta device; build it
            before sharding: the names are the unwrapped module's).
        checkpoint_keys: The tensor names in the checkpoint's files.

    Returns:
        The mapping, the keys nothing takes and the keys that need a conversion.
    """
    conversions = _conversions(model)
    targets = model.state_dict(keep_vars=True)
    keys = CheckpointKeys()
    for key in sorted(checkpoint_keys):
        renamed, is_converted = _rename(key, model, conversions, targets)
        if is_converted:
            keys.converted.append(key)
        elif renamed in targets:
            keys.sources.setdefault(renamed, key)
        else:
            keys.unmatched.append(key)
    # A tied pair is stored once, under either name; from_pretrained ties whichever is present to the other.
    for target, source in dict(getattr(model, "all_tied_weights_keys", None) or {}).items():
        if source in keys.sources or target in keys.sources:
            stored = keys.sources.get(source, keys.sources.get(target))
            keys.sources.setdefault(source, stored)
            keys.sources.setdefault(target, stored)
    return keys


def to_checkpoint_names(model: nn.Module, state_dict: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """`state_dict` (a `PreTrainedModel`'s own names) renamed and converted as `save_pretrained` writes it.

    What a consumer of Hugging Face checkpoints expects (GPT-NeoX's head as `embed_out.weight`), e.g.
    a rollout engine's weight sync. Tied weights are kept under every name `state_dict` gives them.
    """
    try:
        from transformers.core_model_loading import revert_weight_conversion
    except ImportError:
        return dict(state_dict)
    return revert_weight_conversion(model, dict(state_dict))


def describe_mismatch(missing: list[str], unmatched: list[str], limit: int = 5) -> str:
    """One phrase naming the tensors nothing fills and the checkpoint keys nothing takes (the first `limit`)."""

    def first(names: list[str]) -> str:
        more = f" and {len(names) - limit} more" if len(names) > limit else ""
        return ", ".join(names[:limit]) + more

    text = f"have no tensor for {first(missing)}"
    return text + (f"; tensors in the checkpoint that match no parameter: {first(unmatched)}" if unmatched else "")
