"""Batching: padding-free packing (SFT rows, preference pairs) or right padding.

Packing puts a micro-batch's samples into rows of whole samples (best fit, longest first), each row
at most as long as the micro-batch's longest sample, with position ids that restart at 0 for each
sample and no attention mask. Hugging Face models read restarting position ids as separate
sequences and build a block-diagonal causal mask (`masking_utils.find_packed_sequence_indices`), so
no sample attends to another; `tests/trainer/data/test_collate.py` checks that packed and padded
losses agree. Rows are bounded because attention is quadratic in the row: one row holding the whole
micro-batch (8 samples of 64-256 tokens) made packed SFT about 25% slower than padded SFT on CPU.
Rows shorter than the longest are filled with a pad segment that restarts its own positions, so it
is a sequence of its own that no sample sees, and it carries no labels. Preference batches pack their
2B sequences into one row read with variable-length attention (`pack_preference`). Unpaired rows
(KTO) are padded with their mismatched pairs (`pad_unpaired`).
"""

from __future__ import annotations

import torch

from trainer.data.tokenize import IGNORE_INDEX


def example_length(example: dict) -> int:
    """Tokens a sample adds to a batch's width: its sequence, or the longer of a preference pair's two."""
    if "input_ids" in example:
        return len(example["input_ids"])
    return max(len(example["chosen_input_ids"]), len(example["rejected_input_ids"]))


def _best_fit_rows(lengths: list[int], capacity: int) -> list[list[int]]:
    """Indices of `lengths` grouped into rows of at most `capacity` tokens (best-fit decreasing)."""
    rows: list[list[int]] = []
    room: list[int] = []
    for index in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        fits = [row for row in range(len(rows)) if room[row] >= lengths[index]]
        if fits:
            row = min(fits, key=lambda r: room[r])  # the tightest fit
            rows[row].append(index)
            room[row] -= lengths[index]
        else:
            rows.append([index])
            room.append(capacity - lengths[index])
    return rows


def _pack_rows(sequences: list[tuple[list[int], list[int]]], pad_token_id: int,
               width: int | None = None) -> dict[str, torch.Tensor]:
    """Pack (input_ids, labels) sequences into rows of whole sequences, each row `width` tokens (default: the longest).

    Returns:
        input_ids, labels, position_ids, sequence_ids: (R, L); `sequence_ids` holds the index of the
        sequence each token belongs to (len(sequences) for the pad segment). last_positions: (N,) the
        flat index (row * L + column) of each sequence's last token. cu_seq_lens: (S + 1,) int32 start of
        each segment (sequence or pad) of the flattened rows, then R * L; max_length: the longest
        segment (the flash-attention varlen convention). num_tokens: real tokens.
    """
    lengths = [len(ids) for ids, _ in sequences]
    width = width or max(lengths)
    input_ids, labels, position_ids, sequence_ids = [], [], [], []
    last_positions = [0] * len(sequences)
    starts: list[int] = []
    for row_index, row in enumerate(_best_fit_rows(lengths, width)):
        ids, targets, positions, owners = [], [], [], []
        for index in row:
            sequence, sequence_labels = sequences[index]
            starts.append(row_index * width + len(ids))
            ids.extend(sequence)
            # The first token of a sequence is never a target (nothing precedes it); masking it keeps the
            # previous sequence's last position from being trained to predict it.
            targets.extend([IGNORE_INDEX] + sequence_labels[1:])
            positions.extend(range(len(sequence)))
            owners.extend([index] * len(sequence))
            last_positions[index] = row_index * width + len(ids) - 1
        fill = width - len(ids)
        if fill:
            starts.append(row_index * width + len(ids))
        input_ids.append(ids + [pad_token_id] * fill)
        labels.append(targets + [IGNORE_INDEX] * fill)
        positions.extend(range(fill))  # the pad segment is a sequence of its own
        position_ids.append(positions)
        sequence_ids.append(owners + [len(sequences)] * fill)
    boundaries = starts + [len(input_ids) * width]
    as_rows = lambda values: torch.tensor(values, dtype=torch.long)  # noqa: E731
    return {"input_ids": as_rows(input_ids), "labels": as_rows(labels), "position_ids": as_rows(position_ids),
            "sequence_ids": as_rows(sequence_ids), "last_positions": as_rows(last_positions),
            "cu_seq_lens": torch.tensor(boundaries, dtype=torch.int32),
            "max_length": max(end - start for start, end in zip(boundaries[:-1], boundaries[1:])),
            "num_tokens": sum(lengths)}


def pack_sft(examples: list[dict], pad_token_id: int = 0) -> dict[str, torch.Tensor]:
    """Pack examples into rows of whole samples.

    Returns:
        input_ids, labels, position_ids: (R, L), R <= len(examples) rows of L tokens, L the longest
        sample; num_samples; num_tokens (real tokens, without the pad segments).
    """
    packed = _pack_rows([(e["input_ids"], e["labels"]) for e in examples], pad_token_id)
    return {"input_ids": packed["input_ids"], "labels": packed["labels"], "position_ids": packed["position_ids"],
            "num_samples": len(examples), "num_tokens": packed["num_tokens"]}


def pack_preference(examples: list[dict], pad_token_id: int = 0) -> dict[str, torch.Tensor]:
    """Pack a preference batch's 2B sequences (chosen 0..B-1, then rejected B..2B-1) into one padding-free row.

    Inside a pair the chosen and rejected answers differ in length; padding both to one width (as
    `pad_preference` does) spends about a sixth of the work on pad tokens that length grouping cannot
    remove, and rows of whole sequences (as `pack_sft` makes) save little of it, because two answers
    rarely fit into the width of the longest. So every sequence goes into one row, its positions
    restart at 0, and `cu_seq_lens` marks where each starts: the variable-length attention of
    `trainer.modeling.attention` (or flash attention) lets each sequence attend to itself only, and
    costs what the sequences cost. Under plain `sdpa` transformers reads the restarting positions and
    masks the row block-diagonally: the same result, at (row length)^2 attention. The losses read the
    row back by `sequence_ids` (log-prob sums) or `last_positions` (the reward model's last-token read).

    Returns:
        input_ids, labels, position_ids, sequence_ids: (1, N), N the batch's real tokens;
        last_positions: (2B,); cu_seq_lens: (2B + 1,) int32; max_length; margin: (B,); num_samples;
        num_tokens (= N); and, when the examples carry them, ref_logps: (2B,).
    """
    sequences = ([(e["chosen_input_ids"], e["chosen_labels"]) for e in examples]
                 + [(e["rejected_input_ids"], e["rejected_labels"]) for e in examples])
    total = sum(len(ids) for ids, _ in sequences)
    return {**_pack_rows(sequences, pad_token_id, width=total), **_pair_fields(examples)}


def shared_prompt_tokens(examples: list[dict]) -> int:
    """Tokens `pad_preference`'s rows put through a model when each pair's prompt runs once (`dpo.share_prompts`,
    `trainer.modeling.shared_prompts`): the columns before the batch's first label once per pair, the rest once
    per row, padding included."""
    rows = [e["chosen_labels"] for e in examples] + [e["rejected_labels"] for e in examples]
    width = max(len(row) for row in rows)
    split = min(next((i for i, label in enumerate(row) if label != IGNORE_INDEX), len(row)) for row in rows)
    return len(examples) * split + len(rows) * (width - split)


def pack_or_share_preference(examples: list[dict], pad_token_id: int = 0) -> dict[str, torch.Tensor]:
    """A preference batch in whichever form puts fewer tokens through the model: `pad_preference`'s rows, read
    with each pair's prompt run once (`dpo.share_prompts`), or `pack_preference`'s padding-free row.

    Prompts longer than their answers (a 60-token prompt, answers of 4 to 30) go padded and shared: the
    rejected row's prompt, most of its tokens, is not run again. Long answers of unequal length go packed:
    the padding they would need costs more than a prompt's second run. Both forms give the same log-probs.
    """
    total = sum(len(e["chosen_input_ids"]) + len(e["rejected_input_ids"]) for e in examples)  # packed: every token once
    if shared_prompt_tokens(examples) < total:
        return pad_preference(examples, pad_token_id)
    return pack_preference(examples, pad_token_id)


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
    return {
        "input_ids": _pad(rows, pad_token_id, length),
        "labels": _pad(labels, IGNORE_INDEX, length),
        "attention_mask": _pad([[1] * len(row) for row in rows], 0, length),
        **_pair_fields(examples),
    }


def _pair_fields(examples: list[dict]) -> dict[str, torch.Tensor]:
    """What a preference batch carries besides its tokens: margin (B,), num_samples, ref_logps (2B,) if present."""
    fields = {"margin": torch.tensor([e["margin"] for e in examples], dtype=torch.float32),
              "num_samples": len(examples)}
    if "ref_chosen_logps" in examples[0]:
        fields["ref_logps"] = torch.tensor(
            [e["ref_chosen_logps"] for e in examples] + [e["ref_rejected_logps"] for e in examples]
        )
    return fields


def pad_unpaired(examples: list[dict], pad_token_id: int, max_length: int) -> dict[str, torch.Tensor]:
    """Right-pad unpaired rows (KTO), and build each row's mismatched pair for the KL reference point.

    Row i's mismatched sequence is its own prompt followed by the completion of row i - 1 (row 0 takes
    the last row's), cut to `max_length`: the completions of the batch, each paired with another
    prompt (Ethayarajh et al. 2024, section 4.1; TRL rotates completions the same way).

    Returns:
        input_ids, labels, attention_mask: (B, T); kl_input_ids, kl_labels, kl_attention_mask: (B, T');
        desirable: (B,) 1.0 or 0.0; num_samples.
    """
    rows = [(e["input_ids"], e["labels"]) for e in examples]
    mismatched = []
    for index, example in enumerate(examples):
        other = examples[index - 1]
        prompt, start = example["input_ids"][:example["prompt_length"]], other["prompt_length"]
        ids = (prompt + other["input_ids"][start:])[:max_length]
        labels = ([IGNORE_INDEX] * len(prompt) + other["labels"][start:])[:max_length]
        mismatched.append((ids, labels))
    batch = {"desirable": torch.tensor([float(e["desirable"]) for e in examples]), "num_samples": len(examples)}
    for prefix, pairs in (("", rows), ("kl_", mismatched)):
        length = max(len(ids) for ids, _ in pairs)
        batch[f"{prefix}input_ids"] = _pad([ids for ids, _ in pairs], pad_token_id, length)
        batch[f"{prefix}labels"] = _pad([labels for _, labels in pairs], IGNORE_INDEX, length)
        batch[f"{prefix}attention_mask"] = _pad([[1] * len(ids) for ids, _ in pairs], 0, length)
    return batch
