"""Tensor helpers shared by the losses: per-token log-probs and masked reductions."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

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


def packed_sequence_logps(logits: Tensor, labels: Tensor, sequence_ids: Tensor,
                          num_sequences: int) -> tuple[Tensor, Tensor]:
    """Summed log-prob of each packed sequence's labelled tokens (rows of whole sequences, `pack_preference`).

    Equals `sequence_logps` on the same sequences padded one per row: a label at t+1 belongs to the
    sequence of token t+1, and a sequence's first token carries no label, so no sum reads across sequences.

    Args:
        logits: (R, T, V) model outputs over packed rows.
        labels: (R, T) token ids, -100 where no loss is taken.
        sequence_ids: (R, T) index of the sequence each token belongs to; `num_sequences` for padding.
        num_sequences: N, the number of sequences.

    Returns:
        (N,) sums and (N,) token counts.
    """
    logps, mask = token_logps(logits, labels)  # (R, T-1)
    owners = sequence_ids[:, 1:].reshape(-1)  # (R * (T-1),)
    sums = logps.new_zeros(num_sequences + 1).index_add(0, owners, logps.reshape(-1))  # (N + 1,): the pad's last
    counts = mask.new_zeros(num_sequences + 1).index_add(0, owners, mask.reshape(-1))  # (N + 1,)
    return sums[:num_sequences], counts[:num_sequences]


def packed_inputs(batch: dict[str, Tensor]) -> dict[str, Tensor]:
    """Model inputs of a packed batch: tokens, restarting positions and the sequence boundaries.

    `cu_seq_lens_*` and `max_length_*` are the names transformers passes down to the attention
    function (flash attention's varlen convention); `trainer.modeling.attention` reads them on CPU.
    """
    boundaries, longest = batch["cu_seq_lens"], batch["max_length"]
    return {"input_ids": batch["input_ids"], "position_ids": batch["position_ids"],
            "cu_seq_lens_q": boundaries, "cu_seq_lens_k": boundaries, "max_length_q": longest, "max_length_k": longest}


def first_scored_position(labels: Tensor) -> int:
    """The first position whose logits a next-token loss reads: the logit at t scores `labels[:, t+1]`.

    Args:
        labels: (B, T) token ids, -100 where no loss is taken.

    Returns:
        The smallest t (over the batch) with a label at t+1; T-1 when no position carries one.
    """
    scored = (labels[:, 1:] != IGNORE_INDEX).any(0)  # (T-1,)
    positions = scored.nonzero()
    return int(positions[0]) if len(positions) else labels.shape[1] - 1


def scored_logits(model: nn.Module, inputs: dict[str, Tensor], labels: Tensor) -> tuple[Tensor, Tensor]:
    """Logits of a causal LM over the positions a next-token loss reads, and the labels aligned with them.

    The prompt positions before the batch's first label are run through the model but not through its
    output projection (`logits_to_keep`): with a large vocabulary those (B, T, V) logits are the biggest
    tensor of a step. `token_logps(*scored_logits(...))` equals `token_logps(model(**inputs).logits, labels)`.

    Args:
        model: A Hugging Face causal LM (or a wrapper that passes keyword arguments through).
        inputs: Its inputs (input_ids and attention_mask or position_ids), each (B, T).
        labels: (B, T), -100 where no loss is taken.

    Returns:
        logits: (B, T - s, V) for the positions s.. (s = `first_scored_position(labels)`);
        labels: (B, T - s), `labels[:, s:]`.
    """
    start = first_scored_position(labels)
    keep = {"logits_to_keep": labels.shape[1] - start} if start > 0 else {}
    return model(**inputs, use_cache=False, **keep).logits, labels[:, start:]
