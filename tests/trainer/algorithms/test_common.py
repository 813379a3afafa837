"""Tests for the shared tensor helpers in `trainer.algorithms.common`.

Logits are built as log(weights), so softmax(logits) = weights / sum(weights) and every expected
log-prob below is the log of a fraction that can be read off the weight rows.
"""

import math

import torch

from trainer.algorithms.common import masked_mean, sequence_logps, token_logps
from trainer.data.tokenize import IGNORE_INDEX


def logits_from_weights(weights: list) -> torch.Tensor:
    """(B, T, V) logits whose softmax along V is each weight row divided by its sum."""
    return torch.tensor(weights, dtype=torch.float32).log()


# (1, 3, 3): position 0 -> probs [1/4, 2/4, 1/4], position 1 -> [1/4, 1/4, 2/4],
# position 2 -> [5/7, 1/7, 1/7] (never read: the last position has no next token).
WEIGHTS = [[[1, 2, 1], [1, 1, 2], [5, 1, 1]]]


def test_token_logps_scores_each_position_against_the_next_label():
    logps, mask = token_logps(logits_from_weights(WEIGHTS), torch.tensor([[0, 1, 0]]))
    # position 0 predicts labels[1] = 1: p = 2/4; position 1 predicts labels[2] = 0: p = 1/4.
    # (Without the shift it would read labels 0 and 1 at positions 0 and 1: 1/4 and 1/4.)
    expected = torch.tensor([[math.log(2 / 4), math.log(1 / 4)]])
    torch.testing.assert_close(logps, expected)
    torch.testing.assert_close(mask, torch.tensor([[1.0, 1.0]]))


def test_token_logps_zeroes_and_masks_ignored_labels():
    logps, mask = token_logps(logits_from_weights(WEIGHTS), torch.tensor([[0, IGNORE_INDEX, 2]]))
    # position 0's target is -100 -> logp 0, mask 0; position 1 predicts 2: p = 2/4.
    torch.testing.assert_close(logps, torch.tensor([[0.0, math.log(2 / 4)]]))
    torch.testing.assert_close(mask, torch.tensor([[0.0, 1.0]]))


def test_token_logps_never_scores_the_first_label():
    # labels[:, 0] has no preceding position, so -100 or a real id there gives the same result.
    with_id, _ = token_logps(logits_from_weights(WEIGHTS), torch.tensor([[2, 1, 0]]))
    with_ignore, _ = token_logps(logits_from_weights(WEIGHTS), torch.tensor([[IGNORE_INDEX, 1, 0]]))
    expected = torch.tensor([[math.log(2 / 4), math.log(1 / 4)]])  # as in the shift test above
    torch.testing.assert_close(with_id, expected)
    torch.testing.assert_close(with_ignore, expected)


def test_token_logps_equals_log_softmax_gather_on_fixed_logits():
    logits = (torch.arange(2 * 4 * 5, dtype=torch.float32).reshape(2, 4, 5) * 0.7).sin() * 3  # (B, T, V)
    labels = torch.tensor([[IGNORE_INDEX, 4, 0, 3], [1, 2, IGNORE_INDEX, IGNORE_INDEX]])  # (B, T)
    logps, mask = token_logps(logits, labels)
    # The naive form the docstring names, written out: log_softmax over V, pick the next label.
    targets = labels[:, 1:]  # (B, T-1)
    is_labelled = targets != IGNORE_INDEX
    naive = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(logps, torch.where(is_labelled, naive, torch.zeros(())))
    torch.testing.assert_close(mask, is_labelled.float())


def test_token_logps_computes_in_float32_for_bfloat16_logits():
    logps, _ = token_logps(logits_from_weights(WEIGHTS).bfloat16(), torch.tensor([[0, 1, 0]]))
    assert logps.dtype == torch.float32
    # Same fractions as the shift test; bfloat16 rounding of log(w) allows ~1e-2 error.
    torch.testing.assert_close(logps, torch.tensor([[math.log(2 / 4), math.log(1 / 4)]]), atol=2e-2, rtol=0)


def test_sequence_logps_sums_labelled_tokens_and_gives_zero_for_a_fully_padded_row():
    weights = WEIGHTS + [[[1, 1, 1], [1, 1, 1], [1, 1, 1]]]  # (2, 3, 3); row 1 is uniform, p = 1/3
    labels = torch.tensor([[IGNORE_INDEX, 1, 0], [IGNORE_INDEX] * 3])
    sums, counts = sequence_logps(logits_from_weights(weights), labels)
    # row 0: log(2/4) + log(1/4) = log(1/8) over 2 tokens; row 1: nothing labelled -> 0 over 0.
    torch.testing.assert_close(sums, torch.tensor([math.log(1 / 8), 0.0]))
    torch.testing.assert_close(counts, torch.tensor([2.0, 0.0]))


def test_masked_mean_averages_only_unmasked_values():
    values = torch.tensor([1.0, 2.0, 3.0, 100.0])
    mask = torch.tensor([True, False, True, False])
    # (1 + 3) / 2 = 2; the masked 2 and 100 do not count.
    torch.testing.assert_close(masked_mean(values, mask), torch.tensor(2.0))


def test_masked_mean_along_a_dim_averages_each_row_by_its_own_count():
    values = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    # row 0: (1 + 2) / 2 = 1.5; row 1: (4 + 5 + 6) / 3 = 5.
    torch.testing.assert_close(masked_mean(values, mask, dim=1), torch.tensor([1.5, 5.0]))


def test_masked_mean_with_an_all_zero_mask_divides_by_one_instead_of_zero():
    values = torch.tensor([[3.0, 4.0], [5.0, 7.0]])
    mask = torch.tensor([[0, 0], [1, 1]])
    # whole tensor with no mask: 0 / clamp(0, min=1) = 0 / 1 = 0, not nan.
    torch.testing.assert_close(masked_mean(values, torch.zeros_like(mask)), torch.tensor(0.0))
    # per row: row 0 is 0 / 1 = 0, row 1 is (5 + 7) / 2 = 6.
    torch.testing.assert_close(masked_mean(values, mask, dim=-1), torch.tensor([0.0, 6.0]))


def test_scored_logits_cut_the_unscored_prompt_head_and_keep_the_loss():
    from trainer.algorithms.common import first_scored_position, scored_logits, sequence_logps
    from trainer.tiny.model import build_tiny_llama

    # Row 0 is scored from label 4 on, row 1 from label 3 on: the logit at 2 is the first one read.
    labels = torch.tensor([[-100, -100, -100, -100, 7, 8, 9], [-100, -100, -100, 5, 6, -100, -100]])
    assert first_scored_position(labels) == 2
    assert first_scored_position(torch.full((2, 4), -100)) == 3
    model = build_tiny_llama(20).eval()
    inputs = {"input_ids": torch.randint(3, 20, (2, 7)), "attention_mask": torch.tensor([[1] * 7, [1] * 5 + [0] * 2])}
    with torch.no_grad():
        logits, kept = scored_logits(model, inputs, labels)
        full = model(**inputs, use_cache=False).logits
    assert logits.shape == (2, 5, 20) and torch.equal(kept, labels[:, 2:])
    torch.testing.assert_close(sequence_logps(logits, kept)[0], sequence_logps(full, labels)[0])
