"""Tests for the policy losses and `GRPOObjective` in `trainer.algorithms.grpo`.

The policy is a bigram LM whose logits after token i are log(W[i]), so p(j | i) = W[i][j] / sum(W[i]).
Every expected value below is worked out from the formulas of the module docstring by hand.
"""

import math

import pytest
import torch

from tests.trainer.algorithms.stand_ins import BigramLM
from trainer.algorithms.grpo import LOSS_TYPES, GRPOObjective, aggregation_weights

LN2 = math.log(2)

# p(1|0) = 1/4; p(2|1) = 2/8, p(3|1) = 4/8; p(3|2) = 3/6; p(3|3) = 1/8, p(0|3) = 5/8.
POLICY = [[1, 1, 1, 1], [1, 1, 2, 4], [1, 1, 1, 3], [5, 1, 1, 1]]
INPUT_IDS = [[0, 1, 2, 3], [1, 3, 3, 0]]
# Row 0: prompt [0, 1], a 2-token response [2, 3]. Row 1: prompt [1], a 3-token response [3, 3, 0].
MASK = [[0, 0, 1, 1], [0, 1, 1, 1]]
# Log-prob of token t given tokens < t on response tokens, 0 elsewhere (as the experience stores them).
ROW0_LOGPS = [math.log(2 / 8), math.log(3 / 6)]
ROW1_LOGPS = [math.log(4 / 8), math.log(1 / 8), math.log(5 / 8)]
HAND_LOGPS = [[0.0, 0.0, *ROW0_LOGPS], [0.0, *ROW1_LOGPS]]
# The sequence advantage on every response token: 1.0 for row 0, -0.25 for row 1.
ADVANTAGES = [[0.0, 0.0, 1.0, 1.0], [0.0, -0.25, -0.25, -0.25]]


def grpo_batch(old_shift: tuple = (0.0, 0.0), ref_logps: list = HAND_LOGPS, mask: list = MASK) -> dict:
    """The batch with `old_logps` = current log-probs minus `old_shift[row]` on response tokens: ratio exp(shift)."""
    ids = torch.tensor(INPUT_IDS)
    old = [[lp - old_shift[row] * m for lp, m in zip(HAND_LOGPS[row], MASK[row])] for row in range(2)]
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "action_mask": torch.tensor(MASK),
            "loss_mask": torch.tensor(mask), "old_logps": torch.tensor(old), "ref_logps": torch.tensor(ref_logps),
            "advantages": torch.tensor(ADVANTAGES)}


def run(loss_type: str, batch: dict, **options):
    options.setdefault("max_completion_length", 4)
    objective = GRPOObjective(epsilon=0.2, loss_type=loss_type, **options)
    output = objective(BigramLM(POLICY), batch)
    torch.testing.assert_close(output.count, objective.count_units(batch))
    return output


# ---- ratio 1 (old = current), no KL: every clipped loss is -A per token --------------------------
# Token losses: row 0: -1, -1; row 1: 0.25, 0.25, 0.25. Sum -1.25 over 5 tokens.
CISPO_AT_ONE = -(sum(ROW0_LOGPS)) + 0.25 * sum(ROW1_LOGPS)  # -r A log pi with r = 1
SAPO_ROW0, SAPO_ROW1 = -4 * 0.5 / 1.0, 4 * 0.5 / 1.05 * 0.25  # -(4 / tau) sigmoid(0) A
AT_ONE = {  # loss_type: (total, count)
    "dapo": (-1.25, 5.0),  # token sum / active tokens
    "grpo": (-1.0 + 0.25, 2.0),  # row means -1 and 0.25, over 2 responses
    "dr_grpo": (-1.25 / 4, 2.0),  # token sum / (2 responses x 4 max new tokens)
    "bnpo": (-1.25 / 5, 1.0),  # the micro-batch's token mean, one unit
    "luspo": (-1.25, 2.0),  # each response's token sum, over 2 responses
    "cispo": (CISPO_AT_ONE, 5.0),
    "sapo": (SAPO_ROW0 + SAPO_ROW1, 2.0),  # grpo's aggregation of -2 and +0.476 per token
    "vespo": (CISPO_AT_ONE, 5.0),  # w = 1 -> phi(1) = e^lambda e^-lambda = 1: the same as cispo
}


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_on_policy_loss_of_every_loss_type_matches_hand_values(loss_type):
    total, count = AT_ONE[loss_type]
    level = "sequence" if loss_type == "luspo" else "token"
    output = run(loss_type, grpo_batch(), epsilon_high=5.0 if loss_type == "cispo" else None,
                 importance_sampling_level=level)
    torch.testing.assert_close(output.total, torch.tensor(total))
    torch.testing.assert_close(output.count, torch.tensor(count))
    torch.testing.assert_close(output.stats["loss"], torch.tensor(total))
    torch.testing.assert_close(output.stats["clip_fraction"], torch.tensor(0.0))


# ---- ratios off 1: row 0 at 1.5 (A = 1 > 0), row 1 at 0.5 (A = -0.25 < 0) -------------------------
OFF_POLICY = (math.log(1.5), math.log(0.5))


@pytest.mark.parametrize(("epsilon_high", "row0_token"), [(None, -1.2), (0.28, -1.28), (0.6, -1.5)])
def test_clip_higher_raises_only_the_upper_bound(epsilon_high, row0_token):
    # Row 0: -min(1.5 * 1, clip(1.5, 0.8, 1 + eps_high) * 1); row 1: -min(0.5 * -0.25, 0.8 * -0.25) = 0.2 per token.
    output = run("dapo", grpo_batch(OFF_POLICY), epsilon_high=epsilon_high)
    torch.testing.assert_close(output.total, torch.tensor(2 * row0_token + 3 * 0.2))
    clipped_tokens = 3 + (2 if row0_token > -1.5 else 0)  # row 1 is always clipped from below
    torch.testing.assert_close(output.stats["clip_fraction"], torch.tensor(float(clipped_tokens)))


def test_sequence_level_ratio_is_the_geometric_mean_of_the_token_ratios():
    # Row 0's token ratios 2 and 1 (A = 1): per token, 2 is clipped to 1.2 and 1 is not: -1.2 - 1 = -2.2.
    # GSPO: one ratio exp((ln 2 + 0) / 2) = sqrt(2) = 1.414, clipped to 1.2 for both tokens: -2.4.
    batch = grpo_batch()
    batch["old_logps"][0, 2] -= LN2
    token = run("grpo", batch)
    sequence = run("grpo", batch, importance_sampling_level="sequence")
    torch.testing.assert_close(token.total, torch.tensor(-2.2 / 2 + 0.25))  # grpo: row means, summed
    torch.testing.assert_close(sequence.total, torch.tensor(-2.4 / 2 + 0.25))


@pytest.mark.parametrize(("cap", "row0_weight", "row0_clipped"), [(5.0, 1.5, 0.0), (1.2, 1.2, 2.0)])
def test_cispo_clips_the_weight_not_the_update(cap, row0_weight, row0_clipped):
    # -sg(min(r, cap)) A log pi: row 0 r = 1.5, A = 1; row 1 r = 0.5, A = -0.25 (never capped).
    output = run("cispo", grpo_batch(OFF_POLICY), epsilon_high=cap)
    expected = -row0_weight * sum(ROW0_LOGPS) + 0.5 * 0.25 * sum(ROW1_LOGPS)
    torch.testing.assert_close(output.total, torch.tensor(expected))
    torch.testing.assert_close(output.stats["clip_fraction"], torch.tensor(row0_clipped))


def test_sapo_gates_the_ratio_with_a_sigmoid_whose_temperature_depends_on_the_sign():
    sigmoid = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    row0 = -4 / 1.0 * sigmoid(1.0 * 0.5) * 1.0  # tau_pos 1, r - 1 = 0.5
    row1 = -4 / 1.05 * sigmoid(1.05 * -0.5) * -0.25  # tau_neg 1.05, r - 1 = -0.5
    output = run("sapo", grpo_batch(OFF_POLICY))
    torch.testing.assert_close(output.total, torch.tensor(row0 + row1))  # grpo aggregation: one token mean per row


def test_vespo_weights_each_sequence_by_the_gamma_function_of_its_ratio():
    # Row 0: w = 1.5^2 = 2.25, A >= 0: k 2, lambda 3 -> phi = e^3 * 2.25^2 * e^(-3 * 2.25).
    # Row 1: w = 0.5^3 = 0.125, A < 0: k 3, lambda 2 -> phi = e^2 * 0.125^3 * e^(-2 * 0.125).
    phi0 = math.exp(3) * 2.25**2 * math.exp(-6.75)
    phi1 = math.exp(2) * 0.125**3 * math.exp(-0.25)
    output = run("vespo", grpo_batch(OFF_POLICY))
    torch.testing.assert_close(output.total, torch.tensor(-phi0 * sum(ROW0_LOGPS) + 0.25 * phi1 * sum(ROW1_LOGPS)))


def test_luspo_scales_each_sequence_ratio_loss_by_its_length():
    # Sequence ratios 1.5 and 0.5 (uniform shifts): clipped -1.2 per token on row 0, 0.2 on row 1,
    # summed per response (2 and 3 tokens) and averaged over the 2 responses.
    output = run("luspo", grpo_batch(OFF_POLICY), importance_sampling_level="sequence")
    torch.testing.assert_close(output.total / output.count, torch.tensor((2 * -1.2 + 3 * 0.2) / 2))


# ---- KL in the loss ------------------------------------------------------------------------------
# Reference ln2 above the policy on row 0 and ln2 below on row 1 (response tokens only):
# k3 = q - 1 - log q with q = ref / pi: row 0 q = 2 -> 1 - ln2; row 1 q = 1/2 -> ln2 - 0.5.
SHIFTED_REF = [[lp + LN2 * m for lp, m in zip(HAND_LOGPS[0], MASK[0])],
               [lp - LN2 * m for lp, m in zip(HAND_LOGPS[1], MASK[1])]]
K3_ROW0, K3_ROW1 = 1 - LN2, LN2 - 0.5


@pytest.mark.parametrize(("loss_type", "kl_sum"), [("dapo", 2 * K3_ROW0 + 3 * K3_ROW1), ("grpo", K3_ROW0 + K3_ROW1)])
def test_beta_adds_the_k3_kl_to_the_reference_weighted_like_the_loss(loss_type, kl_sum):
    policy_total, _ = AT_ONE[loss_type]
    output = run(loss_type, grpo_batch(ref_logps=SHIFTED_REF), beta=0.1)
    torch.testing.assert_close(output.total, torch.tensor(policy_total + 0.1 * kl_sum))
    torch.testing.assert_close(output.stats["kl/ref"], torch.tensor(kl_sum))


def test_bias_corrected_kl_is_weighted_by_the_ratio():
    # Ratios 1.5 (row 0) and 0.5 (row 1): dapo's clipped policy term -1.8 (see test_clip_higher...) plus
    # beta times each token's k3 times its ratio.
    output = run("dapo", grpo_batch(OFF_POLICY, ref_logps=SHIFTED_REF), beta=0.1, use_bias_correction_kl=True)
    torch.testing.assert_close(output.total, torch.tensor(-1.8 + 0.1 * (1.5 * 2 * K3_ROW0 + 0.5 * 3 * K3_ROW1)))
    plain = run("dapo", grpo_batch(OFF_POLICY, ref_logps=SHIFTED_REF), beta=0.1)
    torch.testing.assert_close(plain.total, torch.tensor(-1.8 + 0.1 * (2 * K3_ROW0 + 3 * K3_ROW1)))


def test_importance_weights_of_stale_experience_multiply_the_policy_term_only():
    batch = grpo_batch(ref_logps=SHIFTED_REF)
    batch["importance_weights"] = torch.full((2, 4), 0.5)
    output = run("dapo", batch, beta=0.1)
    torch.testing.assert_close(output.total, torch.tensor(0.5 * -1.25 + 0.1 * (2 * K3_ROW0 + 3 * K3_ROW1)))


# ---- edge cases: one token, an all-masked row, micro-batches -----------------------------------


@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "luspo", "cispo", "sapo", "vespo"])
def test_a_single_response_token_is_the_whole_loss(loss_type):
    mask = [[0, 0, 0, 1], [0, 0, 0, 0]]  # only row 0's last token counts
    output = run(loss_type, grpo_batch(mask=mask), epsilon_high=5.0)
    one_token = {"cispo": -ROW0_LOGPS[1], "vespo": -ROW0_LOGPS[1], "sapo": -2.0}.get(loss_type, -1.0)
    count = 2.0 if loss_type == "luspo" else 1.0  # luspo counts every row (a constant normaliser)
    torch.testing.assert_close(output.total / output.count, torch.tensor(one_token / count))


@pytest.mark.parametrize(("loss_type", "count"), [("grpo", 1.0), ("dapo", 2.0), ("dr_grpo", 2.0), ("bnpo", 1.0),
                                                  ("luspo", 2.0)])
def test_an_all_masked_row_adds_nothing_and_counts_only_where_the_normaliser_is_a_constant(loss_type, count):
    mask = [[0, 0, 1, 1], [0, 0, 0, 0]]  # row 1 dropped (dynamic sampling or a truncated response)
    output = run(loss_type, grpo_batch(mask=mask))
    expected = {"grpo": -1.0, "dapo": -2.0, "dr_grpo": -2.0 / 4, "bnpo": -1.0, "luspo": -2.0}[loss_type]
    torch.testing.assert_close(output.total, torch.tensor(expected))
    torch.testing.assert_close(output.count, torch.tensor(count))


def split_rows(batch: dict) -> list[dict]:
    return [{k: v[i:i + 1] for k, v in batch.items()} for i in range(2)]


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo"])
def test_micro_batches_give_the_loss_and_gradient_of_one_big_batch(loss_type):
    # What train_step does with two micro-batches: each total over the summed count, gradients added.
    options = {"epsilon_high": 5.0, "importance_sampling_level": "sequence" if loss_type == "luspo" else "token",
               "max_completion_length": 4, "beta": 0.1}
    batch = grpo_batch(OFF_POLICY, ref_logps=SHIFTED_REF)
    whole_policy, split_policy = BigramLM(POLICY), BigramLM(POLICY)
    objective = GRPOObjective(epsilon=0.2, loss_type=loss_type, **options)
    whole = objective(whole_policy, batch)
    (whole.total / whole.count).backward()
    parts = split_rows(batch)
    count = sum(objective.count_units(part) for part in parts)
    split_total = 0.0
    for part in parts:
        output = objective(split_policy, part)
        (output.total / count).backward()
        split_total += output.total.detach()
    torch.testing.assert_close(split_total / count, whole.total.detach() / whole.count)
    torch.testing.assert_close(split_policy.table.weight.grad, whole_policy.table.weight.grad)


def test_bnpo_is_the_mean_of_the_micro_batches_token_means():
    # Row 0: 2 tokens of -1.2 (mean -1.2); row 1: 3 tokens of 0.2 (mean 0.2). As micro-batches: (-1.2 + 0.2) / 2;
    # as one batch: the token mean (-2.4 + 0.6) / 5. bnpo depends on the split by definition.
    objective = GRPOObjective(epsilon=0.2, loss_type="bnpo")
    batch = grpo_batch(OFF_POLICY)
    parts = [objective(BigramLM(POLICY), part) for part in split_rows(batch)]
    torch.testing.assert_close(sum(p.total for p in parts) / sum(p.count for p in parts), torch.tensor(-0.5))
    whole = objective(BigramLM(POLICY), batch)
    torch.testing.assert_close(whole.total / whole.count, torch.tensor(-1.8 / 5))


def test_aggregation_weights_of_dr_grpo_are_one_over_the_constant():
    weights, count = aggregation_weights(torch.tensor(MASK), "dr_grpo", max_completion_length=8)
    torch.testing.assert_close(weights, torch.tensor(MASK) / 8.0)
    torch.testing.assert_close(count, torch.tensor(2.0))


def test_without_a_loss_mask_the_action_mask_counts():
    batch = grpo_batch()
    del batch["loss_mask"]
    torch.testing.assert_close(run("dapo", batch).total, torch.tensor(-1.25))


def test_grpo_objective_gradient_flows_to_the_policy():
    policy = BigramLM(POLICY)
    GRPOObjective(epsilon=0.2, beta=0.1)(policy, grpo_batch(ref_logps=SHIFTED_REF)).total.backward()
    assert policy.table.weight.grad.abs().sum() > 0


def test_unknown_loss_type_and_dr_grpo_without_its_constant_are_refused():
    with pytest.raises(ValueError, match="unknown loss_type 'ppo'"):
        GRPOObjective(epsilon=0.2, loss_type="ppo")
    with pytest.raises(ValueError, match="dr_grpo needs max_completion_length"):
        GRPOObjective(epsilon=0.2, loss_type="dr_grpo")
