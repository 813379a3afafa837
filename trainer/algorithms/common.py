"""Tensor helpers shared by the losses: per-token log-probs and masked reductions."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from trainer.data.tokenize import IGNORE_INDEX


@dataclass(slots=True)
class LossOutput:
    """What an objective returns for one micro-batch.

    Attributes:
        total: () sum of the per-unit losses (units are tokens or pairs), with its graph.
        count: () number of units summed in `total`.
        stats: detached sums over the same units; logged divided by the global count.
    """

    total: Tensor
    count: Tensor
    stats: dict[str, Tensor] = field(default_factory=dict)


def masked_mean(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of `values` where `mask` is 1; the divisor is clamped to at least 1."""
    mask = mask.to(values.dtype)
    if dim is None:
        return (values * mask).sum() / mask.sum().clamp(min=1)
    return (values * mask).sum(dim) / mask.sum(dim).clamp(min=1)


def token_logps(logits: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
    """Log-probability of each next token, and the mask of positions that carry a label.

    Equivalent to `log_softmax(logits[:, :-1]).gather(-1, labels[:, 1:])`, with -100 labels masked.

    Args:
        logits: (B, T, V) model outputs.
        labels: (B, T) token ids, -100 where no loss is taken.

    Returns:
        logps: (B, T-1) log p(labels[:, t+1] | tokens up to t); 0 where masked.
        mask: (B, T-1) 1.0 where a label is present.
    """
    targets = labels[:, 1:]  # (B, T-1)
    mask = targets != IGNORE_INDEX
    safe_targets = targets.masked_fill(~mask, 0)
    logits = logits[:, :-1].float()  # (B, T-1, V)
    picked = torch.gather(logits, -1, safe_targets.unsqueeze(-1)).squeeze(-1)  # (B, T-1)
    logps = picked - torch.logsumexp(logits, dim=-1)  # (B, T-1)
    return torch.where(mask, logps, 0.0), mask.float()  # where, not *: -inf logits must not become NaN


def sequence_logps(logits: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
    """Summed log-prob of each sequence's labelled tokens. Returns (B,) sums and (B,) token counts."""
    logps, mask = token_logps(logits, labels)
    return logps.sum(-1), mask.sum(-1)
