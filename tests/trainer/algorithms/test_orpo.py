"""Tests for the odds-ratio loss and `ORPOObjective` in `trainer.algorithms.orpo`."""

import math

import torch

from tests.trainer.algorithms.stand_ins import BigramLM
from tests.trainer.algorithms.test_dpo import POLICY, preference_batch
from trainer.algorithms.orpo import ORPOObjective, log1mexp, odds_ratio_loss

LN2 = math.log(2)


def test_log1mexp_matches_the_direct_formula_on_both_branches_and_stays_finite_near_zero():
    x = torch.tensor([-5.0, -1.0, -0.5, -1e-3], dtype=torch.float64)
    torch.testing.assert_close(log1mexp(x), torch.log(1 - torch.exp(x)))
    assert torch.isfinite(log1mexp(torch.tensor([-1e-7]))).all()


def test_odds_ratio_loss_hand_value():
    # P_w = 1/2 -> odds 1, log 0; P_l = 1/4 -> odds 1/3. Difference log 3; loss -log sigmoid(log 3) = log(4/3).
    losses, log_odds = odds_ratio_loss(torch.tensor([-LN2]), torch.tensor([-2 * LN2]))
    torch.testing.assert_close(log_odds, torch.tensor([math.log(3)]))
    torch.testing.assert_close(losses, torch.tensor([math.log(4 / 3)]))


def test_odds_ratio_loss_is_finite_when_the_model_is_certain_of_the_chosen_answer():
    losses, _ = odds_ratio_loss(torch.tensor([0.0]), torch.tensor([-1.0]))
    assert torch.isfinite(losses).all()


def hand_orpo(chosen_avg: float, rejected_avg: float, beta: float) -> float:
    odds = lambda avg: avg - math.log(1 - math.exp(avg))  # noqa: E731  log P - log(1 - P)
    return -chosen_avg + beta * -math.log(1 / (1 + math.exp(-(odds(chosen_avg) - odds(rejected_avg)))))


def test_orpo_objective_is_chosen_nll_plus_lambda_times_the_odds_ratio_loss():
    # Chosen [1,2,3]: log(1/8) over 2 tokens; [1,3]: log(1/2) over 1. Rejected [1,3]: log(1/2); [1,2]: log(1/4).
    # No reference: the batch's ref_logps are ignored.
    output = ORPOObjective(beta=0.1)(BigramLM(POLICY), preference_batch(ref_logps=[5.0, 5.0, 5.0, 5.0]))
    pairs = [(-1.5 * LN2, -LN2), (-LN2, -2 * LN2)]
    torch.testing.assert_close(output.total, torch.tensor(sum(hand_orpo(c, r, 0.1) for c, r in pairs)))
    torch.testing.assert_close(output.count, torch.tensor(2.0))
    torch.testing.assert_close(output.stats["nll_loss"], torch.tensor(2.5 * LN2))
    torch.testing.assert_close(output.stats["rewards/accuracies"], torch.tensor(1.0))  # pair 1 only


def test_orpo_gradient_raises_the_chosen_answer():
    policy = BigramLM(POLICY)
    ORPOObjective(beta=0.1)(policy, preference_batch()).total.backward()
    assert -policy.table.weight.grad[2, 3] > 0  # "3 after 2" appears only in a chosen answer: its logit goes up
