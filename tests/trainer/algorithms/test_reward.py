"""Tests for the Bradley-Terry loss and the reward objective in `trainer.algorithms.reward`."""

import math

import pytest
import torch
from torch import nn

from trainer.algorithms.reward import RewardObjective, bradley_terry_loss, last_token_values


def hand_bradley_terry(chosen: float, rejected: float, margin: float = 0.0) -> float:
    """-log(1 / (1 + exp(-(r_chosen - r_rejected - margin)))), in plain math."""
    return -math.log(1 / (1 + math.exp(-(chosen - rejected - margin))))


@pytest.mark.parametrize(
    ("margin", "expected"),
    [
        # differences 1, -1, 0 -> log(1 + e^-1), log(1 + e), log 2
        (None, [hand_bradley_terry(2, 1), hand_bradley_terry(0, 1), hand_bradley_terry(1, 1)]),
        # margins 0.5, -1, 0 shift the differences to 0.5, 0, 0
        ([0.5, -1.0, 0.0], [hand_bradley_terry(2, 1, 0.5), hand_bradley_terry(0, 1, -1), hand_bradley_terry(1, 1)]),
    ],
    ids=["without_margin", "with_margin"],
)
def test_bradley_terry_loss_matches_the_hand_formula(margin, expected):
    chosen, rejected = torch.tensor([2.0, 0.0, 1.0]), torch.tensor([1.0, 1.0, 1.0])
    margin = None if margin is None else torch.tensor(margin)
    torch.testing.assert_close(bradley_terry_loss(chosen, rejected, margin), torch.tensor(expected))


def test_bradley_terry_loss_is_log_two_when_the_difference_equals_the_margin():
    # -log sigmoid(0) = -log(1/2) = log 2, whatever the rewards are.
    losses = bradley_terry_loss(torch.tensor([3.0, -2.0]), torch.tensor([1.0, -2.5]), torch.tensor([2.0, 0.5]))
    torch.testing.assert_close(losses, torch.full((2,), math.log(2)))


def test_last_token_values_reads_the_last_non_pad_position_of_right_padded_rows():
    values = torch.arange(12.0).reshape(3, 4)  # rows [0..3], [4..7], [8..11]
    attention_mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]])
    # lengths 4, 2, 1 -> positions 3, 1, 0 -> values 3, 5, 8
    torch.testing.assert_close(last_token_values(values, attention_mask), torch.tensor([3.0, 5.0, 8.0]))


def test_last_token_values_of_an_empty_row_reads_position_zero_not_the_last_pad():
    values = torch.tensor([[7.0, 8.0, 9.0]])
    # length 0 -> index -1 is clamped to 0 -> 7 (index -1 unclamped would wrap round to 9)
    torch.testing.assert_close(last_token_values(values, torch.zeros(1, 3)), torch.tensor([7.0]))


class TokenValueModel(nn.Module):
    """Reward model stand-in: the value at each position is a learned scalar per token id."""

    def __init__(self, values: list[float]) -> None:
        super().__init__()
        self.values = nn.Embedding(len(values), 1)
        with torch.no_grad():
            self.values.weight.copy_(torch.tensor(values).unsqueeze(1))

    def forward(self, input_ids, attention_mask):
        return self.values(input_ids).squeeze(-1)  # (B, T)


# Token id -> value. Pad id 0 is worth 50, so reading a pad position would be obvious.
TOKEN_VALUES = [50.0, 0.0, 1.5, -0.5, 2.0, 3.0]
PAIR_BATCH = {
    # rows 0-1 chosen, rows 2-3 rejected; last real tokens 2, 4 | 3, 5 -> rewards 1.5, 2.0 | -0.5, 3.0
    "input_ids": torch.tensor([[1, 2, 0], [1, 1, 4], [1, 3, 0], [1, 1, 5]]),
    "attention_mask": torch.tensor([[1, 1, 0], [1, 1, 1], [1, 1, 0], [1, 1, 1]]),
    "margin": torch.tensor([1.0, 0.5]),
}


@pytest.mark.parametrize(
    ("use_margin", "expected_losses"),
    [
        (True, [hand_bradley_terry(1.5, -0.5, 1.0), hand_bradley_terry(2.0, 3.0, 0.5)]),  # x = 1, -1.5
        (False, [hand_bradley_terry(1.5, -0.5), hand_bradley_terry(2.0, 3.0)]),  # x = 2, -1
    ],
)
def test_reward_objective_scores_last_tokens_and_sums_pair_losses(use_margin, expected_losses):
    output = RewardObjective(use_margin=use_margin)(TokenValueModel(TOKEN_VALUES), PAIR_BATCH)
    torch.testing.assert_close(output.total, torch.tensor(sum(expected_losses)))
    torch.testing.assert_close(output.count, torch.tensor(2.0))  # two pairs
    # Stats are sums over the pairs: chosen 1.5 + 2 = 3.5, rejected -0.5 + 3 = 2.5,
    # differences 2 and -1 -> margins 1 and one accurate pair (margins ignore `margin`).
    expected_stats = {"loss": sum(expected_losses), "accuracy": 1.0, "rewards/chosen": 3.5,
                      "rewards/rejected": 2.5, "rewards/margins": 1.0}
    assert set(output.stats) == set(expected_stats)
    for key, value in expected_stats.items():
        torch.testing.assert_close(output.stats[key], torch.tensor(value), msg=key)


def test_reward_objective_sends_no_gradient_to_padding_or_prompt_tokens():
    model = TokenValueModel(TOKEN_VALUES)
    RewardObjective(use_margin=True)(model, PAIR_BATCH).total.backward()
    # d/dx of -log sigmoid(x) is -1 / (1 + e^x), with x = r_chosen - r_rejected - margin:
    # pair 0 has x = 1 (tokens 2 and 3), pair 1 has x = -1.5 (tokens 4 and 5).
    pair0, pair1 = 1 / (1 + math.e), 1 / (1 + math.exp(-1.5))
    expected = torch.tensor([0.0, 0.0, -pair0, pair0, -pair1, pair1])  # pad 0 and prompt 1 get none
    torch.testing.assert_close(model.values.weight.grad.squeeze(1), expected)
