"""Supervised fine-tuning: next-token cross-entropy on completion (assistant) tokens only.

The loss of a step is the mean over every labelled token of the global batch (all micro-batches
and ranks), so packing, padding and the split across ranks do not change it.

Logged metrics: `loss` (mean token NLL), `ppl` is left to readers (exp of loss).
"""

from __future__ import annotations

from torch import Tensor, nn

from trainer.algorithms.common import LossOutput, scored_logits, token_logps
from trainer.data.tokenize import IGNORE_INDEX


def sft_token_loss(logits: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
    """Summed negative log-likelihood of the labelled next tokens.

    Args:
        logits: (B, T, V).
        labels: (B, T), -100 where no loss is taken.

    Returns:
        (loss_sum, num_tokens), both ().
    """
    logps, mask = token_logps(logits, labels)  # (B, T-1)
    return -logps.sum(), mask.sum()


class SFTObjective:
    """Forward pass and loss of one SFT micro-batch (packed or padded)."""

    def count_units(self, batch: dict[str, Tensor]) -> Tensor:
        return (batch["labels"][:, 1:] != IGNORE_INDEX).sum().float()

    def __call__(self, model: nn.Module, batch: dict[str, Tensor]) -> LossOutput:
        inputs = {k: v for k, v in batch.items() if k in ("input_ids", "attention_mask", "position_ids")}
        logits, labels = scored_logits(model, inputs, batch["labels"])  # (B, T', V), (B, T'): prompt-only head cut
        total, count = sft_token_loss(logits, labels)
        return LossOutput(total=total, count=count, stats={"loss": total.detach()})
