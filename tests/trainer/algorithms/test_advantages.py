"""Tests for the critic-free advantage estimators and reward shaping in `trainer.algorithms.advantages`."""

import math

import pytest
import torch

from trainer.algorithms.advantages import (
    STD_EPS,
    group_advantages,
    informative_rows,
    moment_sums,
    moments,
    normalise,
    overlong_penalty,
    reinforce_returns,
    rloo_advantages,
    sequence_kl_penalty,
)

SCORES = torch.tensor([1.0, 2.0, 3.0, 0.0, 0.0, 4.0])  # two groups of three
SQRT3 = math.sqrt(3)


def test_moments_are_the_mean_and_unbiased_std_of_the_masked_values():
    sums = moment_sums(torch.tensor([1.0, 2.0, 3.0, 100.0]), torch.tensor([1, 1, 1, 0]))
    torch.testing.assert_close(sums, torch.tensor([3.0, 6.0, 14.0]))  # count, sum, sum of squares
    batch = moments(sums)
    torch.testing.assert_close(batch.mean, torch.tensor(2.0))
    torch.testing.assert_close(batch.std, torch.tensor(1.0))  # ((1 + 0 + 1) / 2) ** 0.5
    torch.testing.assert_close(moments(moment_sums(torch.tensor([5.0]), torch.ones(1))).std, torch.tensor(0.0))


def test_moments_summed_over_two_halves_equal_the_whole_batch():
    # What the all-reduce of `moment_sums` over ranks gives: the moments of the global batch.
    halves = moment_sums(SCORES[:3], torch.ones(3)) + moment_sums(SCORES[3:], torch.ones(3))
    torch.testing.assert_close(moments(halves).std, SCORES.std())


def test_group_advantages_centre_and_scale_by_unbiased_group_std():
    # Group 1: mean 2, deviations -1, 0, 1, unbiased std 1. Group 2: mean 4/3, deviations -4/3, -4/3, 8/3,
    # unbiased var (16 + 16 + 64) / 9 / 2 = 16/3, std 4 / sqrt(3). Each std gets TRL's 1e-4 added.
    expected = [-1 / (1 + STD_EPS), 0.0, 1 / (1 + STD_EPS)] + [d / (4 / SQRT3 + STD_EPS) for d in (-4 / 3, -4 / 3, 8 / 3)]
    torch.testing.assert_close(group_advantages(SCORES, 3), torch.tensor(expected))


def test_group_advantages_of_a_group_with_equal_scores_are_zero_not_nan():
    advantages = group_advantages(torch.tensor([5.0, 5.0, 5.0, 1.0, 2.0, 3.0]), num_generations=3)
    torch.testing.assert_close(advantages[:3], torch.zeros(3))


def test_group_advantages_without_scale_are_only_centred():  # Dr. GRPO
    advantages = group_advantages(SCORES, 3, scale="none")
    torch.testing.assert_close(advantages, torch.tensor([-1.0, 0.0, 1.0, -4 / 3, -4 / 3, 8 / 3]))


def test_group_advantages_scaled_by_the_batch_std_divide_every_group_by_one_number():
    batch = moments(moment_sums(SCORES, torch.ones(6)))
    std = math.sqrt(40 / 3 / 5)  # mean 5/3; squared deviations sum to 30 - 6 * 25/9 = 40/3; unbiased: / 5
    expected = torch.tensor([-1.0, 0.0, 1.0, -4 / 3, -4 / 3, 8 / 3]) / (std + STD_EPS)
    torch.testing.assert_close(group_advantages(SCORES, 3, scale="batch", batch=batch), expected)


def test_rloo_advantages_subtract_the_mean_of_the_other_responses():
    # Group 1: 1 - (2 + 3) / 2 = -1.5, 2 - (1 + 3) / 2 = 0, 3 - (1 + 2) / 2 = 1.5.
    # Group 2: 0 - (0 + 4) / 2 = -2, -2, 4 - 0 = 4. Each is n / (n - 1) = 1.5 times the centred score.
    torch.testing.assert_close(rloo_advantages(SCORES, 3), torch.tensor([-1.5, 0.0, 1.5, -2.0, -2.0, 4.0]))


def test_rloo_advantages_of_pairs_are_half_the_difference_each_way():
    torch.testing.assert_close(rloo_advantages(torch.tensor([1.0, 0.0]), 2), torch.tensor([1.0, -1.0]))


def test_normalise_uses_the_given_moments_and_zeroes_masked_positions():
    batch = moments(moment_sums(torch.tensor([1.0, 3.0]), torch.ones(2)))  # mean 2, std sqrt(2)
    values = torch.tensor([[1.0, 3.0, 7.0]])
    out = normalise(values, batch, torch.tensor([[1.0, 1.0, 0.0]]))
    s = math.sqrt(2) + STD_EPS
    torch.testing.assert_close(out, torch.tensor([[-1 / s, 1 / s, 0.0]]))


def test_sequence_kl_penalty_subtracts_beta_times_the_summed_response_kl():
    kl = torch.tensor([[9.0, 0.5, 0.25], [9.0, -1.0, 2.0]])  # column 0 is the prompt: not counted
    mask = torch.tensor([[0, 1, 1], [0, 1, 1]])
    out = sequence_kl_penalty(torch.tensor([1.0, 0.0]), kl, mask, kl_coef=0.1)
    torch.testing.assert_close(out, torch.tensor([1.0 - 0.1 * 0.75, 0.0 - 0.1 * 1.0]))


def test_reinforce_returns_are_the_kl_shaped_returns_to_go():
    # Row 0: response at columns 1-3, score 2 on the last token, KL 0.5, 1, 0.5 with beta 0.1:
    # rewards -0.05, -0.1, -0.05 + 2 = 1.95; gamma 1 returns: 1.8, 1.85, 1.95.
    # Row 1: response at columns 1-2 (column 3 is padding), score -1, no KL: returns -1, -1 (gamma 1),
    # and with gamma 0.5: -0.5, -1.
    kl = torch.tensor([[0.0, 0.5, 1.0, 0.5], [0.0, 0.0, 0.0, 7.0]])
    mask = torch.tensor([[0, 1, 1, 1], [0, 1, 1, 0]])
    returns = reinforce_returns(torch.tensor([2.0, -1.0]), kl, mask, kl_coef=0.1, gamma=1.0)
    torch.testing.assert_close(returns, torch.tensor([[0.0, 1.8, 1.85, 1.95], [0.0, -1.0, -1.0, 0.0]]))
    discounted = reinforce_returns(torch.tensor([2.0, -1.0]), kl, mask, kl_coef=0.0, gamma=0.5)
    torch.testing.assert_close(discounted[1], torch.tensor([0.0, -0.5, -1.0, 0.0]))
    torch.testing.assert_close(discounted[0], torch.tensor([0.0, 0.5, 1.0, 2.0]))


@pytest.mark.parametrize(("length", "expected"), [(8, 0.0), (12, 0.0), (13, -0.25), (14, -0.5), (16, -1.0),
                                                  (20, -1.0)])
def test_overlong_penalty_falls_linearly_over_the_buffer(length, expected):
    # max 16 tokens, buffer 4: free up to 12, then -1/4 per token, -1 at 16 and beyond (DAPO eq. 13).
    out = overlong_penalty(torch.tensor([length]), max_length=16, buffer_length=4)
    torch.testing.assert_close(out, torch.tensor([expected]))
    torch.testing.assert_close(overlong_penalty(torch.tensor([length]), max_length=16, buffer_length=4, factor=0.5),
                               torch.tensor([expected * 0.5]))


def test_informative_rows_drop_groups_that_all_score_the_same():
    scores = torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0])
    torch.testing.assert_close(informative_rows(scores, 3), torch.tensor([0.0, 0, 0, 1, 1, 1, 0, 0, 0]))
