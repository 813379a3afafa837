"""Tests for `group_advantages` and `GRPOObjective` in `trainer.algorithms.grpo`.

The policy is a bigram LM whose logits after token i are log(W[i]), so p(j | i) = W[i][j] / sum(W[i]).
"""

import math

import pytest
import torch

from tests.trainer.algorithms.stand_ins import BigramLM
from trainer.algorithms.grpo import GRPOObjective, group_advantages

LN2 = math.log(2)
SQRT3 = math.sqrt(3)


# ---- group_advantages --------------------------------------------------------------------------


def test_group_advantages_centre_and_scale_by_unbiased_group_std():
    advantages = group_advantages(torch.tensor([1.0, 2.0, 3.0, 0.0, 0.0, 4.0]), num_generations=3)
    # Group 1: mean 2, deviations -1, 0, 1, unbiased var (1 + 0 + 1) / 2 = 1 -> -1, 0, 1.
    # Group 2: mean 4/3, deviations -4/3, -4/3, 8/3, unbiased var (16 + 16 + 64) / 9 / 2 = 16/3,
    #          std 4 / sqrt(3) -> -1/sqrt(3), -1/sqrt(3), 2/sqrt(3).
    expected = [-1.0, 0.0, 1.0, -1 / SQRT3, -1 / SQRT3, 2 / SQRT3]
    torch.testing.assert_close(advantages, torch.tensor(expected))


def test_group_advantages_of_a_group_with_equal_scores_are_zero_not_nan():
    advantages = group_advantages(torch.tensor([5.0, 5.0, 5.0, 1.0, 2.0, 3.0]), num_generations=3)
    torch.testing.assert_close(advantages, torch.tensor([0.0, 0.0, 0.0, -1.0, 0.0, 1.0]))  # group 2 as above


@pytest.mark.filterwarnings("ignore:std\\(\\)")
def test_group_advantages_with_one_generation_are_zero():
    # A group of one has no spread (torch.std gives NaN for it): no signal, so 0.
    advantages = group_advantages(torch.tensor([3.0, -1.0]), num_generations=1)
    torch.testing.assert_close(advantages, torch.zeros(2))


def test_group_advantages_without_scale_are_only_centred():
    advantages = group_advantages(torch.tensor([1.0, 2.0, 3.0, 0.0, 0.0, 4.0]), num_generations=3, scale=False)
    torch.testing.assert_close(advantages, torch.tensor([-1.0, 0.0, 1.0, -4 / 3, -4 / 3, 8 / 3]))


# ---- GRPOObjective -----------------------------------------------------------------------------


# p(1|0) = 1/4; p(2|1) = 2/8, p(3|1) = 4/8; p(3|2) = 3/6; p(3|3) = 1/8, p(0|3) = 5/8.
POLICY = [[1, 1, 1, 1], [1, 1, 2, 4], [1, 1, 1, 3], [5, 1, 1, 1]]
INPUT_IDS = [[0, 1, 2, 3], [1, 3, 3, 0]]
# Row 0: prompt [0, 1], a 2-token response [2, 3]. Row 1: prompt [1], a 3-token response [3, 3, 0].
MASK = [[0, 0, 1, 1], [0, 1, 1, 1]]
# Log-prob of token t given tokens < t on response tokens, 0 elsewhere (as the experience stores them).
HAND_LOGPS = [[0.0, 0.0, math.log(2 / 8), math.log(3 / 6)],
              [0.0, math.log(4 / 8), math.log(1 / 8), math.log(5 / 8)]]
# The sequence advantage on every response token: 1.0 for row 0, -0.25 for row 1.
ADVANTAGES = [[0.0, 0.0, 1.0, 1.0], [0.0, -0.25, -0.25, -0.25]]


def grpo_batch(ref_logps: list = HAND_LOGPS) -> dict:
    ids = torch.tensor(INPUT_IDS)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "action_mask": torch.tensor(MASK),
            "old_logps": torch.tensor(HAND_LOGPS), "ref_logps": torch.tensor(ref_logps),
            "advantages": torch.tensor(ADVANTAGES)}


# With old = ref = current log-probs the ratio is 1 and k3 is 0, so each token's loss is -A.
# token: sum over 5 tokens -(1 + 1 - 0.25 * 3) = -1.25, count 5 -> mean -0.25 = -(token mean of A).
# sequence: each row weighs 1 spread over its tokens: -(1 - 0.25) = -0.75, count 2 -> -0.375.
AGGREGATION_CASES = {"token": (-1.25, 5.0), "sequence": (-0.75, 2.0)}


@pytest.mark.parametrize("loss_aggregation", AGGREGATION_CASES)
def test_grpo_objective_with_ratio_one_and_policy_as_ref_is_minus_mean_advantage(loss_aggregation):
    total, count = AGGREGATION_CASES[loss_aggregation]
    objective = GRPOObjective(epsilon=0.2, beta=0.1, loss_aggregation=loss_aggregation)
    batch = grpo_batch()
    output = objective(BigramLM(POLICY), batch)
    torch.testing.assert_close(objective.count_units(batch), torch.tensor(count))
    torch.testing.assert_close(output.count, torch.tensor(count))
    torch.testing.assert_close(output.total, torch.tensor(total))
    torch.testing.assert_close(output.stats["loss"], torch.tensor(total))
    torch.testing.assert_close(output.stats["kl/ref"], torch.tensor(0.0))
    torch.testing.assert_close(output.stats["clip_fraction"], torch.tensor(0.0))


# Reference log-probs ln2 above the policy's on row 0 and ln2 below on row 1 (response tokens only):
# k3 = r - 1 - log r with r = ref / pi: row 0 r = 2 -> 1 - ln2 = 0.3069; row 1 r = 1/2 -> ln2 - 0.5 = 0.1931.
SHIFTED_REF = [[lp + LN2 * m for lp, m in zip(HAND_LOGPS[0], MASK[0])],
               [lp - LN2 * m for lp, m in zip(HAND_LOGPS[1], MASK[1])]]
K3_ROW0, K3_ROW1 = 1 - LN2, LN2 - 0.5
KL_CASES = {
    "token": 2 * K3_ROW0 + 3 * K3_ROW1,  # summed over the 5 response tokens
    "sequence": K3_ROW0 + K3_ROW1,  # each row's token mean, summed over the 2 rows = 0.5
}


@pytest.mark.parametrize("loss_aggregation", KL_CASES)
def test_grpo_objective_adds_beta_times_k3_to_the_reference(loss_aggregation):
    kl_sum = KL_CASES[loss_aggregation]
    policy_total, _ = AGGREGATION_CASES[loss_aggregation]
    output = GRPOObjective(epsilon=0.2, beta=0.1, loss_aggregation=loss_aggregation)(
        BigramLM(POLICY), grpo_batch(ref_logps=SHIFTED_REF))
    torch.testing.assert_close(output.total, torch.tensor(policy_total + 0.1 * kl_sum))
    torch.testing.assert_close(output.stats["kl/ref"], torch.tensor(kl_sum))


def test_grpo_objective_gradient_flows_to_the_policy():
    policy = BigramLM(POLICY)
    GRPOObjective(epsilon=0.2, beta=0.1)(policy, grpo_batch(ref_logps=SHIFTED_REF)).total.backward()
    assert policy.table.weight.grad.abs().sum() > 0
