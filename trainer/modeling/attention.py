"""Variable-length attention for padding-free packed batches, registered with transformers.

A packed preference batch (`trainer.data.collate.pack_preference`) is one row of whole sequences
with position ids that restart at each sequence. Under `sdpa`, transformers reads such a row as
packed and builds a block-diagonal mask over the whole row, so attention costs (row length)^2 and
the mask alone is that big. Under this implementation no mask is built for an unpadded call; the
batch's `cu_seq_lens_q` (the sequence boundaries, in the flash-attention varlen convention that
transformers already passes down to the attention function), or else the restarting `position_ids`,
split the tokens and each sequence attends causally to itself only, with SDPA's causal kernel:
attention costs the sum of (sequence length)^2 and nothing is computed for padding. A layer with a
sliding window (Mistral, Gemma3's local layers, Qwen2 and Phi3 when configured with one) passes it
down, and a sequence longer than the window gets a banded mask of its own length instead. Padded calls
(an attention mask) and cached decoding are plain `sdpa`, so a model set to it behaves as before on
every other input.

`_attn_implementation` is not saved with a model's config, so exported models are unaffected.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

VARLEN_ATTENTION = "alignflow_varlen_sdpa"


def varlen_sdpa_attention(module: nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None,
                          dropout: float = 0.0, scaling: float | None = None, **kwargs: Any) -> tuple[Tensor, None]:
    """Causal attention of each packed sequence to itself; plain `sdpa` for padded or cached calls.

    Args:
        module: The attention module (its `num_key_value_groups` tells grouped-query attention apart).
        query: (B, H, T, D); key, value: (B, H_kv, T, D).
        attention_mask: None for an unpadded call (`sequence_mask` builds none), else sdpa's 4D mask.
        dropout, scaling: As for `scaled_dot_product_attention`.
        kwargs: `cu_seq_lens_q`: (S + 1,) boundaries of the S sequences in the flattened B * T tokens,
            0 first, B * T last; without it they are read off `position_ids` (a sequence starts at 0), and
            without those each row is one sequence. `sliding_window`: the layer's window, if it has one.

    Returns:
        (B, T, H, D) attention output, and None (no attention weights), as transformers expects.
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    boundaries = kwargs.pop("cu_seq_lens_q", None)
    positions = kwargs.get("position_ids")
    is_whole = attention_mask is None and query.shape[2] == key.shape[2] > 1  # no padding, no cache
    if not is_whole:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    batch, heads, length, dim = query.shape
    if boundaries is None and positions is None:  # each row is one sequence (sdpa's mask-free call would drop windows)
        boundaries = torch.arange(0, batch * length + 1, length, device=query.device)
    elif boundaries is None:
        # transformers makes one (1, T) row of positions for a batch it was given none for: it holds for every row.
        # Read as is, its single start would join the B rows into one sequence, each row attending to those above.
        positions = positions.expand(batch, length) if positions.shape[0] == 1 else positions
        starts = (positions.reshape(-1) == 0).nonzero().squeeze(1)  # where each sequence begins in B * T tokens
        boundaries = torch.cat([starts, starts.new_tensor([batch * length])])
    flat = lambda states: states.transpose(0, 1).reshape(1, states.shape[1], batch * length, dim)  # noqa: E731
    query, key, value = flat(query), flat(key), flat(value)  # (1, H, B * T, D): rows laid end to end
    pieces = []  # each (1, H, n_i, D)
    bounds, window = boundaries.tolist(), kwargs.get("sliding_window")
    for start, end in zip(bounds[:-1], bounds[1:], strict=True):
        mask = window_mask(end - start, window, query.device)
        pieces.append(F.scaled_dot_product_attention(
            query[:, :, start:end], key[:, :, start:end], value[:, :, start:end], attn_mask=mask,
            dropout_p=dropout if module.training else 0.0, scale=scaling, is_causal=mask is None,
            enable_gqa=getattr(module, "num_key_value_groups", 1) > 1))
    output = torch.cat(pieces, dim=2).reshape(heads, batch, length, dim)  # (H, B, T, D)
    return output.permute(1, 2, 0, 3).contiguous(), None  # (B, T, H, D)


def window_mask(length: int, window: int | None, device: torch.device) -> Tensor | None:
    """The (length, length) boolean mask of causal attention within a sliding window of `window` tokens (a
    query sees itself and the `window - 1` tokens before it, as transformers' `sliding_window_overlay`), or
    None when the window covers the whole sequence (plain causal attention then)."""
    if window is None or length <= window:
        return None
    query = torch.arange(length, device=device)[:, None]  # (n, 1)
    key = torch.arange(length, device=device)[None, :]  # (1, n)
    return (key <= query) & (key > query - window)  # (n, n)


def sequence_mask(*args: Any, attention_mask: Tensor | None = None, **kwargs: Any) -> Tensor | None:
    """No mask for an unpadded call (the attention reads sequence boundaries instead), else sdpa's."""
    from transformers.masking_utils import sdpa_mask

    if attention_mask is None:
        return None
    return sdpa_mask(*args, attention_mask=attention_mask, **kwargs)


def register_varlen_attention() -> None:
    """Make `VARLEN_ATTENTION` a valid `attn_implementation` (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    AttentionInterface.register(VARLEN_ATTENTION, varlen_sdpa_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(VARLEN_ATTENTION, sequence_mask)


def use_varlen_attention(model: nn.Module) -> bool:
    """Switch a transformers model from `sdpa` to `VARLEN_ATTENTION`; whether it now uses it.

    Eager or flash-attention models keep theirs (False): eager is asked for on purpose, and flash
    attention already reads `cu_seq_lens_q` natively. Either way packed batches stay exact.
    """
    config = getattr(model, "config", None)
    implementation = getattr(config, "_attn_implementation", None)
    if implementation == "sdpa":
        register_varlen_attention()
        config._attn_implementation = VARLEN_ATTENTION
        return True
    return implementation == VARLEN_ATTENTION
