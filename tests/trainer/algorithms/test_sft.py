"""Tests for the SFT loss and objective in `trainer.algorithms.sft`.

Logits are log(weights), so each next-token probability is a weight over its row's sum.
"""

import math

import torch

from tests.trainer.algorithms.stand_ins import BigramLM
from trainer.algorithms.sft import SFTObjective, sft_token_loss
from trainer.data.tokenize import IGNORE_INDEX

X = IGNORE_INDEX
# (B=2, T=4): row 0 trains on its last two tokens; row 1 is 2 tokens long, then right padding.
LABELS = torch.tensor([[X, X, 0, 1], [X, 2, X, X]])
# Labelled next-token probabilities: row 0 position 1 -> label 0 at 1/4, position 2 -> label 1
# at 3/8; row 1 position 0 -> label 2 at 2/4. Loss sum = -(log 1/4 + log 3/8 + log 1/2) = log(64/3).
EXPECTED_LOSS_SUM = math.log(64 / 3)


def sft_logits(junk: float) -> torch.Tensor:
    """(2, 4, 3) logits; positions whose next label is -100 get weights built from `junk`."""
    j = [junk, 1.0, 2 * junk]
    weights = [
        [j, [1, 2, 1], [1, 3, 4], j],  # positions 1 and 2 are read; 0 and 3 are not
        [[1, 1, 2], j, j, j],  # only position 0 is read; 1..3 are padding
    ]
    return torch.tensor(weights, dtype=torch.float32).log()


def test_sft_token_loss_sums_the_nll_of_labelled_next_tokens():
    total, count = sft_token_loss(sft_logits(junk=9.0), LABELS)
    torch.testing.assert_close(total, torch.tensor(EXPECTED_LOSS_SUM))  # log(64/3), see LABELS
    torch.testing.assert_close(count, torch.tensor(3.0))  # two tokens in row 0, one in row 1


def test_sft_token_loss_ignores_logits_at_padded_and_prompt_positions():
    # Only unlabelled positions change (weights 9 -> 1000); the hand value above still holds.
    total, count = sft_token_loss(sft_logits(junk=1000.0), LABELS)
    torch.testing.assert_close(total, torch.tensor(EXPECTED_LOSS_SUM))
    torch.testing.assert_close(count, torch.tensor(3.0))


def test_sft_token_loss_of_a_batch_without_labels_is_zero_over_zero_tokens():
    total, count = sft_token_loss(sft_logits(junk=9.0), torch.full((2, 4), X))
    torch.testing.assert_close(total, torch.tensor(0.0))  # nothing summed
    torch.testing.assert_close(count, torch.tensor(0.0))


def test_sft_objective_counts_labelled_tokens_from_the_second_position_on():
    # labels[:, 0] is never a target, even when it is not -100: row 0 counts 2 (not 3), row 1 counts 1.
    labels = torch.tensor([[5, X, 7, 8], [X, 2, X, X]])
    count = SFTObjective().count_units({"labels": labels})
    torch.testing.assert_close(count, torch.tensor(3.0))


def test_sft_objective_returns_summed_loss_and_token_count_of_a_padded_batch():
    # p(next | 0) = [1, 3, 4] / 8, p(next | 1) = [1, 1, 2] / 4, p(next | 2) = [5, 1, 1] / 7.
    model = BigramLM([[1, 3, 4], [1, 1, 2], [5, 1, 1]])
    batch = {
        "input_ids": torch.tensor([[2, 1, 0, 1], [1, 2, 0, 0]]),  # row 1 right-padded with id 0
        "attention_mask": torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]]),
        "labels": LABELS,
        "num_samples": 2,  # collate metadata: must not reach the model
    }
    output = SFTObjective()(model, batch)
    # row 0: p(0 | 1) = 1/4, p(1 | 0) = 3/8; row 1: p(2 | 1) = 2/4 -> the same log(64/3) as above.
    torch.testing.assert_close(output.total, torch.tensor(EXPECTED_LOSS_SUM))
    torch.testing.assert_close(output.count, torch.tensor(3.0))
    torch.testing.assert_close(output.stats["loss"], torch.tensor(EXPECTED_LOSS_SUM))
    assert output.total.requires_grad and not output.stats["loss"].requires_grad
