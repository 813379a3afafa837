"""Tests for the PPO pieces in `trainer.algorithms.ppo`: KL estimates, reward shaping, GAE, the
clipped losses, the KL controller, log-prob/value alignment and the actor/critic objectives.

The policy is a bigram LM whose logits after token i are log(W[i]), so p(j | i) = W[i][j] / sum(W[i]);
the critic's output after token i is C[i]. Every expected value is worked out in the comments.
"""

import math

import pytest
import torch
from torch import nn

from tests.trainer.algorithms.stand_ins import BigramLM
from trainer.algorithms.ppo import (
    AdaptiveKLController,
    PPOActorObjective,
    PPOCriticObjective,
    clipped_policy_loss,
    clipped_value_loss,
    entropy_from_logits,
    gae_advantages,
    kl_estimate,
    response_logps,
    response_values,
    shape_rewards,
    truncated_importance_weights,
    whiten,
)
from trainer.data.tokenize import IGNORE_INDEX as X

LN2 = math.log(2)


# ---- kl_estimate -------------------------------------------------------------------------------

LOGPS = [[-1.0, -2.0, -0.5]]
REF_LOGPS = [[-1.5, -2.0, 0.0]]  # log ref - log pi = [-0.5, 0, 0.5]


def test_kl_estimate_k1_is_the_log_ratio():
    kl = kl_estimate(torch.tensor(LOGPS), torch.tensor(REF_LOGPS), "k1")
    torch.testing.assert_close(kl, torch.tensor([[0.5, 0.0, -0.5]]))  # log pi - log ref, may be negative


def test_kl_estimate_k3_matches_ratio_minus_one_minus_log_ratio():
    kl = kl_estimate(torch.tensor(LOGPS), torch.tensor(REF_LOGPS), "k3")
    # r = ref / pi = exp(log ref - log pi); k3 = r - 1 - log r with log r = -0.5, 0, 0.5.
    expected = [[math.exp(-0.5) - 1 + 0.5, 0.0, math.exp(0.5) - 1 - 0.5]]  # 0.1065, 0, 0.1487
    torch.testing.assert_close(kl, torch.tensor(expected))


def test_kl_estimate_k3_is_non_negative_and_zero_for_equal_policies():
    logps = torch.linspace(-6, 0, 25).reshape(5, 5)  # (B, T)
    ref_logps = logps.flip(0)  # every sign of log ratio appears
    assert (kl_estimate(logps, ref_logps, "k3") >= 0).all()
    torch.testing.assert_close(kl_estimate(logps, logps.clone(), "k3"), torch.zeros(5, 5))


def test_kl_estimate_rejects_an_unknown_estimator():
    with pytest.raises(ValueError, match="k2"):
        kl_estimate(torch.zeros(1, 2), torch.zeros(1, 2), "k2")


# ---- shape_rewards -----------------------------------------------------------------------------

# Row 0: prompt at 0, response at 1-3, padding at 4. Row 1: prompt at 0-1, response at 2-4 (no padding).
ACTION_MASK = [[0, 1, 1, 1, 0], [0, 0, 1, 1, 1]]
KL = [[1.0, 2.0, 3.0, 4.0, 5.0], [-1.0, -2.0, -3.0, 4.0, 10.0]]  # nonzero on masked tokens on purpose


@pytest.mark.parametrize("mask_dtype", [torch.long, torch.float32])
def test_shape_rewards_adds_the_score_only_at_the_last_response_token(mask_dtype):
    rewards = shape_rewards(torch.tensor([1.0, -2.0]), torch.tensor(KL), torch.tensor(ACTION_MASK, dtype=mask_dtype),
                            kl_coef=0.1)
    expected = [
        [0.0, -0.2, -0.3, -0.4 + 1.0, 0.0],  # -0.1 * KL on response tokens; score 1 on position 3
        [0.0, 0.0, 0.3, -0.4, -1.0 - 2.0],  # score -2 on the last column
    ]
    torch.testing.assert_close(rewards, torch.tensor(expected))


def test_shape_rewards_with_zero_kl_coef_is_the_score_at_the_last_token_only():
    rewards = shape_rewards(torch.tensor([1.0, -2.0]), torch.tensor(KL), torch.tensor(ACTION_MASK), kl_coef=0.0)
    torch.testing.assert_close(rewards, torch.tensor([[0.0, 0, 0, 1, 0], [0, 0, 0, 0, -2]]))


def test_shape_rewards_clips_the_score_but_not_the_kl_penalty():
    rewards = shape_rewards(torch.tensor([3.0, -2.0]), torch.tensor(KL), torch.tensor(ACTION_MASK), kl_coef=0.1,
                            reward_clip=1.5)
    # scores 3 -> 1.5 and -2 -> -1.5; the KL term -1.0 at row 1, position 4 is left as it is.
    expected = [[0.0, -0.2, -0.3, -0.4 + 1.5, 0.0], [0.0, 0.0, 0.3, -0.4, -1.0 - 1.5]]
    torch.testing.assert_close(rewards, torch.tensor(expected))


# ---- gae_advantages ----------------------------------------------------------------------------

# Row 0: prompt 0-1, response 2-4, padding 5. Row 1: prompt 0, response 1-3, padding 4-5.
# Masked positions hold 9 (rewards) and 7 (values) so that reading them would change the result;
# in particular V = 7 right after each response checks that the value after the last token is 0.
GAE_MASK = [[0, 0, 1, 1, 1, 0], [0, 1, 1, 1, 0, 0]]
GAE_REWARDS = [[9, 9, 0.0, 0.0, 1.0, 9], [9, -0.5, 0.0, 2.0, 9, 9]]
GAE_VALUES = [[7, 7, 0.5, 1.0, 0.25, 7], [7, 1.0, 2.0, 0.5, 7, 7]]


def reference_gae(rewards: list, values: list, mask: list, gamma: float, lam: float) -> tuple[list, list]:
    """Plain-Python GAE: keep the response tokens of each row, recurse backwards, scatter back."""
    advantages, returns = [], []
    for row_rewards, row_values, row_mask in zip(rewards, values, mask):
        positions = [t for t, m in enumerate(row_mask) if m]
        row_advantages = [0.0] * len(row_mask)
        running, next_value = 0.0, 0.0  # nothing after the last response token
        for t in reversed(positions):
            delta = row_rewards[t] + gamma * next_value - row_values[t]
            running = delta + gamma * lam * running
            row_advantages[t], next_value = running, row_values[t]
        advantages.append(row_advantages)
        returns.append([a + v if m else 0.0 for a, v, m in zip(row_advantages, row_values, row_mask)])
    return advantages, returns


def run_gae(gamma: float, lam: float):
    return gae_advantages(torch.tensor(GAE_REWARDS, dtype=torch.float32), torch.tensor(GAE_VALUES, dtype=torch.float32),
                          torch.tensor(GAE_MASK), gamma=gamma, lam=lam)


def test_gae_matches_hand_values_with_discount_and_lambda():
    advantages, returns = run_gae(gamma=0.5, lam=0.5)  # gamma * lam = 0.25
    # Row 0: t=4: delta = 1 + 0.5 * 0 - 0.25 = 0.75                       -> A = 0.75
    #        t=3: delta = 0 + 0.5 * 0.25 - 1 = -0.875; -0.875 + 0.25 * 0.75 -> A = -0.6875
    #        t=2: delta = 0 + 0.5 * 1 - 0.5 = 0;       0 + 0.25 * -0.6875   -> A = -0.171875
    # Row 1: t=3: delta = 2 + 0.5 * 0 - 0.5 = 1.5                         -> A = 1.5
    #        t=2: delta = 0 + 0.5 * 0.5 - 2 = -1.75;   -1.75 + 0.25 * 1.5   -> A = -1.375
    #        t=1: delta = -0.5 + 0.5 * 2 - 1 = -0.5;   -0.5 + 0.25 * -1.375 -> A = -0.84375
    expected_advantages = [[0, 0, -0.171875, -0.6875, 0.75, 0], [0, -0.84375, -1.375, 1.5, 0, 0]]
    # returns = A + V on response tokens: 0.328125, 0.3125, 1.0 and 0.15625, 0.625, 2.0.
    expected_returns = [[0, 0, 0.328125, 0.3125, 1.0, 0], [0, 0.15625, 0.625, 2.0, 0, 0]]
    torch.testing.assert_close(advantages, torch.tensor(expected_advantages))
    torch.testing.assert_close(returns, torch.tensor(expected_returns))


def test_gae_with_gamma_and_lambda_one_is_future_reward_sum_minus_value():
    advantages, returns = run_gae(gamma=1.0, lam=1.0)
    # A_t = sum of response rewards from t on - V_t.
    # Row 0: rewards 0, 0, 1 -> future sums 1, 1, 1; minus V 0.5, 1, 0.25 -> 0.5, 0, 0.75.
    # Row 1: rewards -0.5, 0, 2 -> future sums 1.5, 2, 2; minus V 1, 2, 0.5 -> 0.5, 0, 1.5.
    torch.testing.assert_close(advantages, torch.tensor([[0, 0, 0.5, 0.0, 0.75, 0], [0, 0.5, 0.0, 1.5, 0, 0]]))
    # ... so the returns are the future reward sums themselves.
    torch.testing.assert_close(returns, torch.tensor([[0, 0, 1.0, 1.0, 1.0, 0], [0, 1.5, 2.0, 2.0, 0, 0]]))


def test_gae_with_lambda_zero_is_the_one_step_td_error():
    advantages, _ = run_gae(gamma=1.0, lam=0.0)
    # A_t = r_t + V_{t+1} - V_t, with V after the last response token = 0.
    # Row 0: 0 + 1 - 0.5 = 0.5; 0 + 0.25 - 1 = -0.75; 1 + 0 - 0.25 = 0.75.
    # Row 1: -0.5 + 2 - 1 = 0.5; 0 + 0.5 - 2 = -1.5; 2 + 0 - 0.5 = 1.5.
    torch.testing.assert_close(advantages, torch.tensor([[0, 0, 0.5, -0.75, 0.75, 0], [0, 0.5, -1.5, 1.5, 0, 0]]))


@pytest.mark.parametrize(("gamma", "lam"), [(0.5, 0.5), (1.0, 1.0), (0.99, 0.95), (0.9, 0.0)])
def test_gae_matches_a_plain_python_recursion(gamma, lam):
    advantages, returns = run_gae(gamma, lam)
    expected_advantages, expected_returns = reference_gae(GAE_REWARDS, GAE_VALUES, GAE_MASK, gamma, lam)
    torch.testing.assert_close(advantages, torch.tensor(expected_advantages))
    torch.testing.assert_close(returns, torch.tensor(expected_returns))
    mask = torch.tensor(GAE_MASK).bool()
    assert (advantages[~mask] == 0).all() and (returns[~mask] == 0).all()
    torch.testing.assert_close(returns[mask], (advantages + torch.tensor(GAE_VALUES))[mask])


# ---- whiten ------------------------------------------------------------------------------------


def test_whiten_normalises_masked_entries_and_zeroes_the_rest():
    values = torch.tensor([[1.0, 2.0, 3.0, 100.0], [-50.0, 5.0, 6.0, 1e4]])
    mask = torch.tensor([[1, 1, 1, 0], [0, 1, 1, 0]])
    out = whiten(values, mask)
    # Masked entries 1, 2, 3, 5, 6: mean 17 / 5 = 3.4; deviations -2.4, -1.4, -0.4, 1.6, 2.6;
    # population variance (5.76 + 1.96 + 0.16 + 2.56 + 6.76) / 5 = 3.44.
    std = math.sqrt(3.44)
    expected = [[-2.4 / std, -1.4 / std, -0.4 / std, 0.0], [0.0, 1.6 / std, 2.6 / std, 0.0]]
    torch.testing.assert_close(out, torch.tensor(expected))
    picked = out[mask.bool()]
    torch.testing.assert_close(picked.mean(), torch.tensor(0.0), atol=1e-6, rtol=0)
    torch.testing.assert_close((picked**2).mean(), torch.tensor(1.0))


# ---- clipped losses and entropy ----------------------------------------------------------------

# (advantage, ratio, expected loss, clipped?) with cliprange 0.2: loss = max(-A r, -A clip(r, 0.8, 1.2)).
POLICY_CASES = [
    (1.0, 1.1, -1.1, 0.0),  # inside: both terms -1.1
    (1.0, 1.5, -1.2, 1.0),  # A > 0, r above 1.2: max(-1.5, -1.2) -> the clipped term
    (1.0, 0.5, -0.5, 0.0),  # A > 0, r below 0.8: max(-0.5, -0.8) -> unclipped (pessimistic)
    (-1.0, 1.5, 1.5, 0.0),  # A < 0, r above 1.2: max(1.5, 1.2) -> unclipped
    (-1.0, 0.5, 0.8, 1.0),  # A < 0, r below 0.8: max(0.5, 0.8) -> the clipped term
    (-2.0, 0.9, 1.8, 0.0),  # inside: both terms 1.8
]


def test_clipped_policy_loss_matches_hand_values_and_clip_indicator():
    advantages = torch.tensor([[a for a, _, _, _ in POLICY_CASES]])  # (1, 6)
    logps = torch.tensor([[math.log(r) for _, r, _, _ in POLICY_CASES]], requires_grad=True)
    losses, clipped = clipped_policy_loss(logps, torch.zeros(1, 6), advantages, cliprange=0.2)
    torch.testing.assert_close(losses, torch.tensor([[loss for _, _, loss, _ in POLICY_CASES]]))
    torch.testing.assert_close(clipped, torch.tensor([[c for _, _, _, c in POLICY_CASES]]))
    # d(-A r)/d logp = -A r on the unclipped branch; the clipped branch is flat.
    losses.sum().backward()
    torch.testing.assert_close(logps.grad, torch.tensor([[-1.1, 0.0, -0.5, 1.5, 0.0, 1.8]]))


# ---- stale experience: truncated importance weights and the decoupled surrogate ------------------


def test_truncated_importance_weight_matches_hand_values():
    # pi_old / pi_behav per token: 0.5 / 0.25 = 2.0 (truncated to the cap 1.5), 0.2 / 0.4 = 0.5,
    # 0.3 / 0.3 = 1.0 (on-policy), and a masked position (both 0) = exp(0) = 1.
    old = torch.tensor([[math.log(0.5), math.log(0.2), math.log(0.3), 0.0]])
    behaviour = torch.tensor([[math.log(0.25), math.log(0.4), math.log(0.3), 0.0]])
    weights = truncated_importance_weights(old, behaviour, cap=1.5)
    torch.testing.assert_close(weights, torch.tensor([[1.5, 0.5, 1.0, 1.0]]))


def test_truncated_importance_weight_of_an_overflowing_ratio_is_the_cap():
    weights = truncated_importance_weights(torch.tensor([[0.0]]), torch.tensor([[-1000.0]]), cap=2.0)  # exp(1000) = inf
    torch.testing.assert_close(weights, torch.tensor([[2.0]]))


def test_importance_weights_multiply_the_clipped_surrogate_and_carry_no_gradient():
    # Token 1: A = 1, ratio 1.1 (inside the clip range): loss -1.1, times w = 0.5 -> -0.55.
    # Token 2: A = -1, ratio 1.5: max(-A r, -A clip(r)) = max(1.5, 1.2) = 1.5 (unclipped), times w = 2 -> 3.0.
    logps = torch.tensor([[math.log(1.1), math.log(1.5)]], requires_grad=True)
    weights = torch.tensor([[0.5, 2.0]], requires_grad=True)
    losses, _ = clipped_policy_loss(logps, torch.zeros(1, 2), torch.tensor([[1.0, -1.0]]), cliprange=0.2,
                                    importance_weights=truncated_importance_weights(weights.log(), torch.zeros(1, 2),
                                                                                    cap=4.0))
    torch.testing.assert_close(losses, torch.tensor([[-0.55, 3.0]]))
    losses.sum().backward()
    torch.testing.assert_close(logps.grad, torch.tensor([[-0.55, 3.0]]))  # w * d(-A r)/d logp
    assert weights.grad is None  # the weights are constants of the step


def test_unit_importance_weights_leave_the_objective_unchanged():
    logps = torch.tensor([[math.log(r) for _, r, _, _ in POLICY_CASES]])
    advantages = torch.tensor([[a for a, _, _, _ in POLICY_CASES]])
    plain, _ = clipped_policy_loss(logps, torch.zeros(1, 6), advantages, cliprange=0.2)
    weighted, _ = clipped_policy_loss(logps, torch.zeros(1, 6), advantages, cliprange=0.2,
                                      importance_weights=torch.ones(1, 6))
    torch.testing.assert_close(weighted, plain)


# (value, old value, return, expected loss, clipped?) with cliprange_value 0.2:
# loss = 0.5 max((V - R)^2, (clip(V, V_old - 0.2, V_old + 0.2) - R)^2).
VALUE_CASES = [
    (1.0, 0.9, 0.0, 0.5, 0.0),  # V inside the band: both terms 1.0
    (1.5, 1.0, 0.0, 1.125, 0.0),  # clipped V 1.2: max(2.25, 1.44) -> unclipped
    (1.5, 1.0, 2.0, 0.32, 1.0),  # clipped V 1.2: max(0.25, 0.64) -> clipped
    (0.0, 1.0, 0.5, 0.125, 0.0),  # clipped V 0.8: max(0.25, 0.09) -> unclipped
    (0.0, 1.0, -1.0, 1.62, 1.0),  # clipped V 0.8: max(1.0, 3.24) -> clipped
]


def test_clipped_value_loss_matches_hand_values_for_both_branches():
    values, old_values, returns, expected, clipped_expected = (torch.tensor([column]) for column in zip(*VALUE_CASES))
    losses, clipped = clipped_value_loss(values, old_values, returns, cliprange_value=0.2)
    torch.testing.assert_close(losses, expected)
    torch.testing.assert_close(clipped, clipped_expected)


def test_entropy_of_uniform_logits_is_log_vocab_size():
    entropy = entropy_from_logits(torch.full((2, 3, 5), 0.7))  # (B, T, V) with V = 5
    torch.testing.assert_close(entropy, torch.full((2, 3), math.log(5)))


def test_entropy_of_a_two_point_distribution():
    entropy = entropy_from_logits(torch.tensor([[[math.log(1), math.log(3)]]]))  # p = [1/4, 3/4]
    expected = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))  # 0.5623
    torch.testing.assert_close(entropy, torch.tensor([[expected]]))


# ---- AdaptiveKLController ----------------------------------------------------------------------


def test_kl_controller_without_target_keeps_its_value():
    controller = AdaptiveKLController(kl_coef=0.1, target_kl=None, horizon=100)
    controller.update(observed_kl=50.0, num_samples=64)
    assert controller.value == 0.1


@pytest.mark.parametrize(
    ("observed_kl", "expected"),
    [
        (1.1, 0.1 * (1 + 0.1 * 100 / 1000)),  # error 1.1 / 1 - 1 = 0.1 -> grows to 0.101
        (0.95, 0.1 * (1 - 0.05 * 100 / 1000)),  # error -0.05 -> shrinks to 0.0995
        (10.0, 0.1 * (1 + 0.2 * 100 / 1000)),  # error 9 clipped to 0.2 -> 0.102
        (0.0, 0.1 * (1 - 0.2 * 100 / 1000)),  # error -1 clipped to -0.2 -> 0.098
    ],
    ids=["above_target", "below_target", "far_above_clipped", "far_below_clipped"],
)
def test_kl_controller_moves_towards_target_with_clipped_error(observed_kl, expected):
    controller = AdaptiveKLController(kl_coef=0.1, target_kl=1.0, horizon=1000)
    controller.update(observed_kl=observed_kl, num_samples=100)
    assert controller.value == pytest.approx(expected)


def test_kl_controller_updates_compound():
    controller = AdaptiveKLController(kl_coef=0.1, target_kl=1.0, horizon=10)
    controller.update(observed_kl=2.0, num_samples=5)  # 0.1 * (1 + 0.2 * 0.5) = 0.11
    controller.update(observed_kl=2.0, num_samples=5)  # 0.11 * 1.1 = 0.121
    assert controller.value == pytest.approx(0.121)


# ---- log-prob / value alignment and the objectives ---------------------------------------------


class TokenCritic(nn.Module):
    """Critic stand-in: the value after reading token i is C[i], whatever came before. Returns (B, T)."""

    def __init__(self, values: list) -> None:
        super().__init__()
        self.table = nn.Embedding(len(values), 1)
        with torch.no_grad():
            self.table.weight.copy_(torch.tensor(values).unsqueeze(-1))

    def forward(self, input_ids, attention_mask=None, position_ids=None):
        return self.table(input_ids).squeeze(-1)  # (B, T)


# p(1|0) = 1/4; p(2|1) = 2/8, p(3|1) = 4/8; p(3|2) = 3/6; p(3|3) = 1/8, p(0|3) = 5/8.
POLICY = [[1, 1, 1, 1], [1, 1, 2, 4], [1, 1, 1, 3], [5, 1, 1, 1]]
CRITIC = [0.5, 1.0, -1.0, 2.0]
INPUT_IDS = [[0, 1, 2, 3], [1, 3, 3, 0]]
# Position t scores token t given tokens < t; position 0 has no prefix and holds 0.
HAND_LOGPS = [[0.0, math.log(1 / 4), math.log(2 / 8), math.log(3 / 6)],
              [0.0, math.log(4 / 8), math.log(1 / 8), math.log(5 / 8)]]
# Row 0: prompt [0, 1], response [2, 3]. Row 1: prompt [1], response [3, 3, 0]. Five response tokens.
MASK = [[0, 0, 1, 1], [0, 1, 1, 1]]


def entropy_of_row(weights: list) -> float:
    total = sum(weights)
    return -sum(w / total * math.log(w / total) for w in weights)


# Entropy at position t is that of the distribution after token t-1; 0 at position 0.
HAND_ENTROPY = [[0.0] + [entropy_of_row(POLICY[i]) for i in INPUT_IDS[0][:-1]],
                [0.0] + [entropy_of_row(POLICY[i]) for i in INPUT_IDS[1][:-1]]]


def sequence_batch(**extra) -> dict:
    ids = torch.tensor(INPUT_IDS)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "action_mask": torch.tensor(MASK),
            **{k: torch.tensor(v, dtype=torch.float32) for k, v in extra.items()}}


def test_response_logps_position_t_scores_token_t_given_its_prefix():
    logps, entropy = response_logps(BigramLM(POLICY), sequence_batch(), with_entropy=True)
    torch.testing.assert_close(logps, torch.tensor(HAND_LOGPS))
    torch.testing.assert_close(entropy, torch.tensor(HAND_ENTROPY))
    torch.testing.assert_close(response_logps(BigramLM(POLICY), sequence_batch()), torch.tensor(HAND_LOGPS))


def test_response_values_are_shifted_right_by_one():
    values = response_values(TokenCritic(CRITIC), sequence_batch())
    # position t holds the critic's output after token t-1: C[0], C[1], C[2] and C[1], C[3], C[3].
    torch.testing.assert_close(values, torch.tensor([[0.0, 0.5, 1.0, -1.0], [0.0, 1.0, 2.0, 2.0]]))


# Masked positions hold 9 so that reading them would show.
ADVANTAGES = [[9, 9, 0.5, -1.0], [9, 2.0, 0.25, -0.5]]  # response sum 1.25; positives 2.75, negatives -1.5


def test_actor_objective_with_ratio_one_is_minus_the_advantage_sum():
    objective = PPOActorObjective(cliprange=0.2)
    batch = sequence_batch(old_logps=HAND_LOGPS, advantages=ADVANTAGES)
    output = objective(BigramLM(POLICY), batch)
    torch.testing.assert_close(objective.count_units(batch), torch.tensor(5.0))
    torch.testing.assert_close(output.count, torch.tensor(5.0))
    torch.testing.assert_close(output.total, torch.tensor(-1.25))  # ratio 1: -(0.5 - 1 + 2 + 0.25 - 0.5)
    torch.testing.assert_close(output.stats["loss"], torch.tensor(-1.25))
    torch.testing.assert_close(output.stats["clip_fraction"], torch.tensor(0.0))
    torch.testing.assert_close(output.stats["kl/approx"], torch.tensor(0.0))


def test_actor_objective_entropy_bonus_subtracts_the_masked_entropy_sum():
    batch = sequence_batch(old_logps=HAND_LOGPS, advantages=ADVANTAGES)
    output = PPOActorObjective(cliprange=0.2, entropy_coef=0.1)(BigramLM(POLICY), batch)
    # Response tokens read the distributions after: row 0 tokens 1, 2; row 1 tokens 1, 3, 3.
    entropy_sum = sum(entropy_of_row(POLICY[i]) for i in [1, 2, 1, 3, 3])
    torch.testing.assert_close(output.total, torch.tensor(-1.25 - 0.1 * entropy_sum))
    torch.testing.assert_close(output.stats["entropy"], torch.tensor(entropy_sum))


def test_actor_objective_clips_when_the_ratio_leaves_the_range():
    old_logps = [[lp - math.log(1.5) for lp in row] for row in HAND_LOGPS]  # ratio 1.5 everywhere
    output = PPOActorObjective(cliprange=0.2)(BigramLM(POLICY), sequence_batch(old_logps=old_logps,
                                                                               advantages=ADVANTAGES))
    # A > 0 tokens are clipped to 1.2: -1.2 * 2.75 = -3.3; A < 0 keep 1.5: -1.5 * -1.5 = 2.25.
    torch.testing.assert_close(output.total, torch.tensor(-3.3 + 2.25))
    torch.testing.assert_close(output.stats["clip_fraction"], torch.tensor(3.0))  # the three A > 0 tokens
    torch.testing.assert_close(output.stats["kl/approx"], torch.tensor(5 * 0.5 * math.log(1.5) ** 2))


def test_actor_objective_adds_the_pretraining_loss_weighted_by_response_tokens():
    batch = sequence_batch(old_logps=HAND_LOGPS, advantages=ADVANTAGES)
    batch["ptx_input_ids"], batch["ptx_labels"] = torch.tensor([[1, 2, 3]]), torch.tensor([[X, 2, 3]])
    output = PPOActorObjective(cliprange=0.2, ptx_coef=0.5)(BigramLM(POLICY), batch)
    # ptx NLL: -(log 2/8 + log 3/6) / 2 tokens = 3 ln2 / 2; times ptx_coef and the 5 response tokens.
    ptx_mean = 1.5 * LN2
    torch.testing.assert_close(output.total, torch.tensor(-1.25 + 0.5 * ptx_mean * 5))
    torch.testing.assert_close(output.stats["ptx_loss"], torch.tensor(ptx_mean * 5))


def test_actor_objective_gradient_flows_to_the_policy():
    policy = BigramLM(POLICY)
    PPOActorObjective(cliprange=0.2)(policy, sequence_batch(old_logps=HAND_LOGPS, advantages=ADVANTAGES)).total.backward()
    assert policy.table.weight.grad.abs().sum() > 0


def test_critic_objective_inside_clip_range_is_half_squared_error():
    # Critic values on response tokens (see the alignment test): row 0: 1.0, -1.0; row 1: 1.0, 2.0, 2.0.
    old_values = [[9, 9, 1.125, -0.875], [9, 0.875, 2.125, 1.875]]  # 0.125 from the new values: inside 0.2
    returns = [[9, 9, 1.5, -1.0], [9, 0.0, 2.5, 1.0]]
    objective = PPOCriticObjective(cliprange_value=0.2, vf_coef=0.5)
    batch = sequence_batch(values=old_values, returns=returns)
    output = objective(TokenCritic(CRITIC), batch)
    # squared errors: 0.25, 0 and 1, 0.25, 1 -> sum 2.5; 0.5 * 2.5 = 1.25 value loss; times vf_coef 0.5.
    torch.testing.assert_close(objective.count_units(batch), torch.tensor(5.0))
    torch.testing.assert_close(output.count, torch.tensor(5.0))
    torch.testing.assert_close(output.total, torch.tensor(0.625))
    torch.testing.assert_close(output.stats["value_loss"], torch.tensor(1.25))
    torch.testing.assert_close(output.stats["value_clip_fraction"], torch.tensor(0.0))
