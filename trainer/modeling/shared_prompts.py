"""One forward per distinct prompt where rows repeat prompts: the prompt's keys and values are computed once and
shared by every row that samples, or sampled, from it.

GRPO samples G responses per prompt, and PPO's rollouts may repeat prompts too. Sampling and scoring them
row by row runs each prompt's tokens through the model G times, which TRL also does. Here each distinct
prompt runs once with the KV cache on and every row gets its prompt's keys and values:

- `prefilled_prompts`: `generate` starts from that cache (the `hf` engine), so it decodes at once; the samples
  are those of the plain call.
- `shared_prompt_logits`: the update's log-probs (and the old and reference log-probs) run only the response
  columns on top of the cache. The gather is differentiable, so every row's gradient flows back into the one
  prompt forward and is summed there.

The logits equal the full forward's (each prompt token sees the same keys in the same order). The arithmetic
saved is (G - 1) / G of the prompt's share of the tokens: at G = 8 with prompts twice as long as the
responses, 58% of the update's forward and backward (benchmarks/README.md, `grpo_instructed`).

Used where it is exact and the wrappers allow it (`shares_prompts`): a Hugging Face causal LM with full
attention in every layer (a sliding window would cut the shared keys), alone or in DDP (the prompt forward
runs on the inner module, the response forward through DDP, so DDP's reducer sees one forward and one
backward per step), without gradient checkpointing (it turns the cache off in training). FSDP2-sharded
models (their forward is a collective, and ranks could differ in whether they share), a forward through
ColossalAI's wrappers, and batches whose prompts are all distinct take the plain forward.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import Tensor, nn

from trainer.parallel.booster import unwrap_model


def prompt_groups(input_ids: Tensor, attention_mask: Tensor, split: int) -> tuple[Tensor, Tensor] | None:
    """Rows whose columns before `split` (tokens and mask) are identical, as groups.

    Args:
        input_ids, attention_mask: (B, T) the batch.
        split: The columns before it are compared: the prompt (scoring), or all of it but its last token
            (the prefill before `generate`).

    Returns:
        (U,) one row of each group and (B,) each row's group, or None when no two rows share a prompt.
    """
    prompts = torch.cat([input_ids[:, :split], attention_mask[:, :split].to(input_ids.dtype)], dim=1)  # (B, 2 split)
    distinct, group = torch.unique(prompts, dim=0, return_inverse=True)  # (U, 2 split), (B,)
    if len(distinct) == len(prompts):
        return None
    rows = torch.arange(len(prompts), device=group.device)
    representative = torch.empty(len(distinct), dtype=torch.long, device=group.device).scatter_(0, group, rows)  # (U,)
    return representative, group


def shares_prompts(model: nn.Module) -> bool:
    """Whether `shared_prompt_logits` may run on `model` (see the module's docstring for why each case is left out)."""
    from torch.distributed.fsdp import FSDPModule

    inner = unwrap_model(model)
    if model is not inner and not isinstance(model, nn.parallel.DistributedDataParallel):
        return False  # ColossalAI's wrappers do their own work around the forward
    if isinstance(inner, FSDPModule) or not hasattr(inner, "generate") or getattr(inner, "config", None) is None:
        return False
    base = _base_model(inner)
    # transformers 5.24 renamed the flag and warns on the old name's use
    checkpointing = next((name for name in ("is_activation_checkpointing", "is_gradient_checkpointing")
                          if hasattr(type(base), name)), None)
    if checkpointing is not None and getattr(base, checkpointing):
        return False
    config = inner.config
    if getattr(config, "sliding_window", None) is not None and getattr(config, "use_sliding_window", True):
        return False
    return all(kind == "full_attention" for kind in getattr(config, "layer_types", None) or ())


def shared_prompt_logits(model: nn.Module, batch: dict[str, Tensor], start: int) -> Tensor | None:
    """The logits `model` gives from column `start` on (what `logits_to_keep=T - start` returns), with each
    distinct prompt (the columns up to `start`) run once; None when no two rows share a prompt.

    Args:
        model: A model `shares_prompts` accepts.
        batch: input_ids and attention_mask (B, T), and position_ids where the batch has them.
        start: The last prompt column: its logit scores the first response token. At least 0.

    Returns:
        (B, T - start, V) logits.
    """
    input_ids, attention_mask = batch["input_ids"], batch["attention_mask"]
    split = start + 1
    positions = batch.get("position_ids")
    if positions is None:  # what the model would use on its own: 0, 1, ... over the whole row
        positions = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
    shared = _gathered_prompt_cache(unwrap_model(model), input_ids, attention_mask, positions, split)
    if shared is None:
        return None
    prompt_logits, cache_name, cache, group = shared
    responses = model(input_ids=input_ids[:, split:], attention_mask=attention_mask,
                      position_ids=positions[:, split:], use_cache=True, **{cache_name: cache})
    # index_select, not indexing: its backward (a scatter-add) is several times cheaper on CPU than indexing's
    # (index_put with accumulation), and it sums each row's gradient into its prompt the same way.
    return torch.cat([prompt_logits.index_select(0, group), responses.logits], dim=1)  # (B, 1 + T - split, V)


def prefilled_prompts(model: nn.Module, prompt_ids: Tensor, prompt_mask: Tensor) -> dict[str, Any]:
    """The keyword argument that hands `model.generate` a KV cache of every row's prompt but its last token, each
    distinct prompt run once; {} when no two rows share a prompt (or a prompt is a single column).

    `generate` then runs only the last prompt column before decoding, as it would after its own prefill.

    Args:
        model: The unwrapped policy, one `shares_prompts` accepts, in eval mode.
        prompt_ids, prompt_mask: (B, P) left-padded prompts, what `generate` is given.
    """
    if prompt_ids.shape[1] < 2 or getattr(getattr(model, "generation_config", None), "cache_implementation", None):
        return {}  # nothing to prefill, or `generate` is to build a cache of its own kind (static, offloaded)
    positions = (prompt_mask.long().cumsum(-1) - 1).clamp(min=0)  # (B, P), what `generate` gives real tokens
    shared = _gathered_prompt_cache(model, prompt_ids, prompt_mask, positions, prompt_ids.shape[1] - 1)
    if shared is None:
        return {}
    _, cache_name, cache, _ = shared
    return {cache_name: cache}


def _gathered_prompt_cache(model: nn.Module, input_ids: Tensor, attention_mask: Tensor, positions: Tensor,
                           length: int) -> tuple[Tensor, str, Any, Tensor] | None:
    """Each distinct prefix of `length` columns run once through `model` (the unwrapped module), its KV cache
    gathered to every row.

    Rows are grouped by those columns alone: whatever follows them is run per row on top of the cache.

    Returns:
        The prefix forward's last logits (U, 1, V), the name of the cache argument, the cache (B rows, `length`
        positions), and each row's group (B,); None when no two rows share the prefix or the cache is of a kind
        that cannot be gathered (a recurrent layer's state).
    """
    groups = prompt_groups(input_ids, attention_mask, length)
    if groups is None:
        return None
    representative, group = groups
    name = cache_argument(model)
    prefix = model(input_ids=input_ids[representative, :length], attention_mask=attention_mask[representative, :length],
                   position_ids=positions[representative, :length], use_cache=True, logits_to_keep=1)
    cache = prefix.get(name)
    if not hasattr(cache, "batch_select_indices"):
        return None
    _select_cache_rows(cache, group)  # every row gets its prefix's keys and values (B, heads, length, dim)
    return prefix.logits, name, cache, group


def _select_cache_rows(cache: Any, rows: Tensor) -> None:
    """`cache.batch_select_indices(rows)`, with each full-attention layer's keys and values gathered by
    `index_select`: the same tensors, but a backward several times cheaper on CPU than that of the indexing
    `batch_select_indices` does (issue 49: 8 such backwards a step of `dpo_short`). Other layers keep theirs."""
    from transformers.cache_utils import DynamicLayer

    layers = getattr(cache, "layers", None)
    if layers is None or any(type(layer) is not DynamicLayer for layer in layers):
        cache.batch_select_indices(rows)
        return
    for layer in layers:
        if isinstance(getattr(layer, "keys", None), Tensor) and layer.keys.numel() > 0:
            layer.keys, layer.values = layer.keys.index_select(0, rows), layer.values.index_select(0, rows)


def cache_argument(model: nn.Module) -> str:
    """The name under which `model` takes and returns its KV cache: `cache` from transformers 5.24 on (where the
    old name warns), `past_key_values` before."""
    return "cache" if "cache" in inspect.signature(type(_base_model(model)).forward).parameters else "past_key_values"


def _base_model(model: nn.Module) -> nn.Module:
    """The Hugging Face model itself: a PEFT model's base (which passes arguments through), else `model`."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model
