"""Batching: padding-free packing for SFT, right padding for everything else.

Packing concatenates a micro-batch into one row of shape (1, sum of lengths) with position ids
that restart at 0 for each sample and no attention mask. Hugging Face models read restarting
position ids as separate sequences and build a block-diagonal causal mask (`masking_utils`), so no
sample attends to another; `tests/trainer/data/test_collate.py` checks that packed and padded
losses agree.
"""

from __future__ import annotations

import torch

from trainer.data.tokenize import IGNORE_INDEX


def pack_sft(examples: list[dict]) -> dict[str, torch.Tensor]:
    """Concatenate examples into one row: input_ids, labels, position_ids, each (1, N); num_samples."""
    input_ids, labels, position_ids = [], [], []
    for example in examples:
        input_ids.extend(example["input_ids"])
        # The first token of a sample is never a target (nothing precedes it); masking it keeps the
        # previous sample's last position from being trained to predict it.
        labels.extend([IGNORE_INDEX] + example["labels"][1:])
        position_ids.extend(range(len(example["input_ids"])))
    as_row = lambda values: torch.tensor([values], dtype=torch.long)  # noqa: E731
    return {"input_ids": as_row(input_ids), "labels": as_row(labels), "position_ids": as_row(position_ids),
            "num_samples": len(examples)}


def _pad(rows: list[list[int]], value: int, length: int) -> torch.Tensor:
    return torch.tensor([row + [value] * (length - len(row)) for row in rows], dtype=torch.long)


def pad_sft(examples: list[dict], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Right-pad examples. Returns input_ids, labels, attention_mask, each (B, T)."""
    length = max(len(e["input_ids"]) for e in examples)
    return {
        "input_ids": _pad([e["input_ids"] for e in examples], pad_token_id, length),
        "labels": _pad([e["labels"] for e in examples], IGNORE_INDEX, length),
        "attention_mask": _pad([[1] * len(e["input_ids"]) for e in examples], 0, length),
        "num_samples": len(examples),
    }


def pad_preference(examples: list[dict], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Stack chosen rows then rejected rows so one forward pass scores both.

    Returns:
        input_ids, labels, attention_mask: (2B, T), rows 0..B-1 chosen and B..2B-1 rejected;
        margin: (B,); and, when the examples carry them, ref_logps: (2B,).
    """
    rows = [e["chosen_input_ids"] for e in examples] + [e["rejected_input_ids"] for e in examples]
    labels = [e["chosen_labels"] for e in examples] + [e["rejected_labels"] for e in examples]
    length = max(len(row) for row in rows)
    batch = {
        "input_ids": _pad(rows, pad_token_id, length),
        "labels": _pad(labels, IGNORE_INDEX, length),
        "attention_mask": _pad([[1] * len(row) for row in rows], 0, length),
        "margin": torch.tensor([e["margin"] for e in examples], dtype=torch.float32),
        "num_samples": len(examples),
    }
    if "ref_chosen_logps" in examples[0]:
        batch["ref_logps"] = torch.tensor(
            [e["ref_chosen_logps"] for e in examples] + [e["ref_rejected_logps"] for e in examples]
        )
    return batch
