"""Variable-length attention for padding-free packed batches, registered with transformers.

A packed preference batch (`trainer.data.collate.pack_preference`) is one row of whole sequences
with position ids that restart at each sequence. Under `sdpa`, transformers reads such a row as
packed and builds a block-diagonal mask over the whole row, so attention costs (row length)^2 and
the mask alone is that big. Under this implementation, the batch's `cu_seq_lens_q` (the sequence
boundaries, in the flash-attention varlen convention that transformers already passes down to the
attention function) splits the row and each sequence attends causally to itself only, with SDPA's
causal kernel: attention costs the sum of (sequence length)^2 and nothing is computed for padding.
Without `cu_seq_lens_q` (padded batches, generation) it is plain `sdpa`, masks included, so a model
set to it behaves as before on every other input.

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
    """Causal attention of each packed sequence to itself; plain `sdpa` when the call carries no boundaries.

    Args:
        module: The attention module (its `num_key_value_groups` tells grouped-query attention apart).
        query: (1, H, N, D); key, value: (1, H_kv, N, D) for one packed row of N tokens.
        attention_mask: sdpa's mask; unread for a packed row (the boundaries say the same).
        dropout, scaling: As for `scaled_dot_product_attention`.
        kwargs: `cu_seq_lens_q`: (S + 1,) int boundaries of the S sequences in the row, 0 first, N last.

    Returns:
        (1, N, H, D) attention output, and None (no attention weights), as transformers expects.
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    boundaries = kwargs.pop("cu_seq_lens_q", None)
    if boundaries is None or query.shape[0] != 1:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    grouped = getattr(module, "num_key_value_groups", 1) > 1
    dropout = dropout if module.training else 0.0
    bounds = boundaries.tolist()
    pieces = [
        F.scaled_dot_product_attention(query[:, :, start:end], key[:, :, start:end], value[:, :, start:end],
                                       dropout_p=dropout, scale=scaling, is_causal=True, enable_gqa=grouped)
        for start, end in zip(bounds[:-1], bounds[1:], strict=True)
    ]  # each (1, H, n_i, D)
    return torch.cat(pieces, dim=2).transpose(1, 2).contiguous(), None  # (1, N, H, D)


def register_varlen_attention() -> None:
    """Make `VARLEN_ATTENTION` a valid `attn_implementation` (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(VARLEN_ATTENTION, varlen_sdpa_attention)
    # sdpa's masks, so that every call without boundaries is exactly sdpa. For a packed row that is a
    # block-diagonal (1, 1, N, N) boolean mask the varlen path does not read: N^2 bytes, built once per forward.
    ALL_MASK_ATTENTION_FUNCTIONS.register(VARLEN_ATTENTION, sdpa_mask)


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
