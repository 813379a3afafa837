"""Tests for the preference losses and `DPOObjective` in `trainer.algorithms.dpo`.

The policy is a bigram LM whose logits after token i are log(W[i]), so p(j | i) = W[i][j] / sum(W[i]).
"""

import math

import pytest
import torch

from tests.trainer.algorithms.stand_ins import BigramLM
from trainer.algorithms.dpo import (
    LOSS_TYPES,
    DPOObjective,
    PairLogps,
    aot_loss,
    chosen_nll_loss,
    ipo_loss,
    pair_loss,
    sigmoid_preference_loss,
    simpo_loss,
)
from trainer.data.tokenize import IGNORE_INDEX as X

LN2 = math.log(2)


def neg_log_sigmoid(x: float) -> float:
    return -math.log(1 / (1 + math.exp(-x)))


def hand_sigmoid(h: float, beta: float, eps: float = 0.0) -> float:
    """Conservative DPO: -(1 - eps) log sigmoid(beta h) - eps log sigmoid(-beta h)."""
    return (1 - eps) * neg_log_sigmoid(beta * h) + eps * neg_log_sigmoid(-beta * h)


def hand_ipo(h: float, beta: float) -> float:
    return (h - 1 / (2 * beta)) ** 2


CHOSEN, REJECTED = [1.0, -0.5], [0.0, 0.5]  # differences h = 1 and -1


@pytest.mark.parametrize(
    ("loss", "kwargs", "expected"),
    [
        (sigmoid_preference_loss, {"beta": 0.1}, [hand_sigmoid(1, 0.1), hand_sigmoid(-1, 0.1)]),
        (sigmoid_preference_loss, {"beta": 0.5, "label_smoothing": 0.2},
         [hand_sigmoid(1, 0.5, 0.2), hand_sigmoid(-1, 0.5, 0.2)]),
        (ipo_loss, {"beta": 0.5}, [0.0, 4.0]),  # (1 - 1)^2, (-1 - 1)^2 with 1 / (2 * 0.5) = 1
        (ipo_loss, {"beta": 0.1}, [16.0, 36.0]),  # (1 - 5)^2, (-1 - 5)^2
        # beta * h - gamma = 2 * 1 - 0.5 = 1.5 and 2 * -1 - 0.5 = -2.5
        (simpo_loss, {"beta": 2.0, "gamma": 0.5}, [neg_log_sigmoid(1.5), neg_log_sigmoid(-2.5)]),
    ],
    ids=["sigmoid", "sigmoid_label_smoothing", "ipo_beta_0.5", "ipo_beta_0.1", "simpo"],
)
def test_pair_loss_matches_its_paper_formula(loss, kwargs, expected):
    losses = loss(torch.tensor(CHOSEN), torch.tensor(REJECTED), **kwargs)
    torch.testing.assert_close(losses, torch.tensor(expected))


@pytest.mark.parametrize("label_smoothing", [0.0, 0.3])
def test_sigmoid_preference_loss_is_log_two_for_equal_log_ratios(label_smoothing):
    # beta * h = 0 -> -(1 - eps) log(1/2) - eps log(1/2) = log 2 for every beta and eps.
    losses = sigmoid_preference_loss(torch.tensor([0.7]), torch.tensor([0.7]), beta=3.0,
                                     label_smoothing=label_smoothing)
    torch.testing.assert_close(losses, torch.tensor([LN2]))


# p(2 | 1) = 2/8, p(3 | 1) = 4/8, p(3 | 2) = 3/6; rows 0 (pad) and 3 are never read for a label.
POLICY = [[1, 1, 1, 97], [1, 1, 2, 4], [1, 1, 1, 3], [5, 1, 1, 1]]
# Policy log-probs: chosen [1,2,3] -> log 1/4 + log 1/2 = log 1/8, [1,3] -> log 1/2;
# rejected [1,3] -> log 1/2, [1,2] -> log 1/4.
ROWS = [([1, 2, 3], [X, 2, 3]), ([1, 3], [X, 3]), ([1, 3], [X, 3]), ([1, 2], [X, 2])]


def preference_batch(pad_width: int = 0, pad_id: int = 0, ref_logps: list | None = None) -> dict:
    """Rows 0-1 chosen, 2-3 rejected, right-padded to 3 + pad_width with `pad_id` and -100 labels."""
    length = 3 + pad_width
    pad = lambda row, value: row + [value] * (length - len(row))  # noqa: E731
    batch = {
        "input_ids": torch.tensor([pad(ids, pad_id) for ids, _ in ROWS]),
        "labels": torch.tensor([pad(labels, X) for _, labels in ROWS]),
        "attention_mask": torch.tensor([pad([1] * len(ids), 0) for ids, _ in ROWS]),
        "margin": torch.zeros(2),
    }
    if ref_logps is not None:
        batch["ref_logps"] = torch.tensor(ref_logps)
    return batch


# Precomputed reference: chosen log-ratios log 1/8 - log 1/16 = ln2 and 0; rejected 0 and
# log 1/4 - log 1/2 = -ln2 -> h = [ln2, ln2], both pairs accurate. Reference-free (ref 0): the
# log-ratios are the policy log-probs, h = [-2 ln2, ln2], and only pair 1 is accurate.
REF_LOGPS = [math.log(1 / 16), math.log(1 / 2), math.log(1 / 2), math.log(1 / 2)]
CASES = {  # name: (ref_logps in the batch, chosen log-ratios, rejected log-ratios)
    "reference_free": (None, [-3 * LN2, -LN2], [-LN2, -2 * LN2]),
    "precomputed_ref_logps": (REF_LOGPS, [LN2, 0.0], [0.0, -LN2]),
}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("loss_type", ["sigmoid", "ipo"])
def test_dpo_objective_matches_hand_values_and_stats(loss_type, case):
    ref_logps, chosen, rejected = CASES[case]
    beta = 0.5
    h = [c - r for c, r in zip(chosen, rejected)]
    hand = hand_ipo if loss_type == "ipo" else hand_sigmoid
    output = DPOObjective(beta=beta, loss_type=loss_type)(BigramLM(POLICY), preference_batch(ref_logps=ref_logps))
    torch.testing.assert_close(output.total, torch.tensor(sum(hand(x, beta) for x in h)))
    torch.testing.assert_close(output.count, torch.tensor(2.0))  # two pairs
    expected_stats = {  # sums over the two pairs; rewards are beta times the log-ratios
        "rewards/chosen": beta * sum(chosen), "rewards/rejected": beta * sum(rejected),
        "rewards/margins": beta * sum(h), "rewards/accuracies": float(sum(x > 0 for x in h)),
        "logps/chosen": math.log(1 / 8 * 1 / 2), "logps/rejected": math.log(1 / 2 * 1 / 4),
    }
    for key, value in expected_stats.items():
        torch.testing.assert_close(output.stats[key], torch.tensor(value), msg=key)


@pytest.mark.parametrize(("pad_width", "pad_id"), [(0, 0), (2, 0), (3, 3)])
def test_dpo_objective_loss_is_unchanged_by_padding_tokens(pad_width, pad_id):
    batch = preference_batch(pad_width, pad_id, ref_logps=REF_LOGPS)
    output = DPOObjective(beta=0.5)(BigramLM(POLICY), batch)
    # h = [ln2, ln2] as in the precomputed case, whatever the padding columns hold.
    torch.testing.assert_close(output.total, torch.tensor(2 * hand_sigmoid(LN2, 0.5)))


def test_dpo_objective_with_policy_as_reference_model_gives_log_two_per_pair():
    policy = BigramLM(POLICY)
    output = DPOObjective(beta=0.5, ref_model=policy)(policy, preference_batch())
    # every log-ratio is 0 -> each pair's loss is -log sigmoid(0) = log 2, and no pair is "accurate".
    torch.testing.assert_close(output.total, torch.tensor(2 * LN2))
    torch.testing.assert_close(output.stats["rewards/accuracies"], torch.tensor(0.0))
    # Only the policy pass may carry a graph: if the reference pass did too, h = logp - logp would
    # be identically 0 and the gradient would vanish; d loss / d h = -beta / 2 at h = 0 instead.
    output.total.backward()
    assert policy.table.weight.grad.abs().sum() > 0


def test_simpo_objective_uses_length_normalised_logps_and_ignores_ref_logps():
    beta, gamma = 2.0, 0.5
    output = DPOObjective(beta=beta, loss_type="simpo", simpo_gamma=gamma)(
        BigramLM(POLICY), preference_batch(pad_width=2, ref_logps=REF_LOGPS))
    # per-token means: chosen log(1/8)/2 = -1.5 ln2 and -ln2; rejected -ln2 and -2 ln2.
    chosen, rejected = [-1.5 * LN2, -LN2], [-LN2, -2 * LN2]
    hand = [neg_log_sigmoid(beta * (c - r) - gamma) for c, r in zip(chosen, rejected)]
    torch.testing.assert_close(output.total, torch.tensor(sum(hand)))
    torch.testing.assert_close(output.stats["rewards/chosen"], torch.tensor(beta * sum(chosen)))
    torch.testing.assert_close(output.stats["rewards/margins"], torch.tensor(beta * 0.5 * LN2))  # -0.5 + 1
    torch.testing.assert_close(output.stats["rewards/accuracies"], torch.tensor(1.0))  # pair 1 only


def test_chosen_nll_loss_is_per_token_and_clamps_empty_responses():
    # -log(1/8) over 2 tokens = 1.5 ln2; an empty response (0 tokens, log-prob 0) counts as 1 token -> 0.
    losses = chosen_nll_loss(torch.tensor([math.log(1 / 8), 0.0]), torch.tensor([2.0, 0.0]))
    torch.testing.assert_close(losses, torch.tensor([1.5 * LN2, 0.0]))


# Per-token NLL of the chosen rows: [1,2,3] -> -log(1/8) / 2 = 1.5 ln2; [1,3] -> -log(1/2) / 1 = ln2.
CHOSEN_NLL = 1.5 * LN2 + LN2


@pytest.mark.parametrize("loss_type", ["sigmoid", "ipo", "simpo"])
def test_rpo_alpha_adds_the_weighted_chosen_nll_to_every_loss_type(loss_type):
    batch = preference_batch(ref_logps=REF_LOGPS)
    plain = DPOObjective(beta=0.5, loss_type=loss_type)(BigramLM(POLICY), batch)
    rpo = DPOObjective(beta=0.5, loss_type=loss_type, rpo_alpha=0.7)(BigramLM(POLICY), batch)
    torch.testing.assert_close(rpo.total, plain.total + 0.7 * torch.tensor(CHOSEN_NLL))
    for output in (plain, rpo):  # logged either way; the loss includes it only with rpo_alpha
        torch.testing.assert_close(output.stats["nll_loss"], torch.tensor(CHOSEN_NLL))
    torch.testing.assert_close(rpo.stats["loss"], rpo.total)


def test_rpo_objective_matches_the_hand_value_of_dpo_plus_nll():
    # Precomputed reference: h = [ln2, ln2] (see REF_LOGPS); alpha = 1 as in Pang et al. 2024.
    output = DPOObjective(beta=0.5, rpo_alpha=1.0)(BigramLM(POLICY), preference_batch(ref_logps=REF_LOGPS))
    torch.testing.assert_close(output.total, torch.tensor(2 * hand_sigmoid(LN2, 0.5) + 2.5 * LN2))


def test_rpo_gradient_raises_the_chosen_answer_even_when_dpo_alone_is_indifferent():
    # One pair whose chosen and rejected responses are the same sequence: the DPO loss is constant
    # (h = 0 whatever the weights), so only the NLL term can move the policy, and it moves it up.
    batch = {"input_ids": torch.tensor([[1, 2], [1, 2]]), "labels": torch.tensor([[X, 2], [X, 2]]),
             "attention_mask": torch.ones(2, 2, dtype=torch.long), "ref_logps": torch.zeros(2)}
    plain_policy, rpo_policy = BigramLM(POLICY), BigramLM(POLICY)
    DPOObjective(beta=0.5)(plain_policy, batch).total.backward()
    DPOObjective(beta=0.5, rpo_alpha=1.0)(rpo_policy, batch).total.backward()
    assert plain_policy.table.weight.grad.abs().max() == 0
    step = -rpo_policy.table.weight.grad  # a gradient-descent step direction
    assert step[1, 2] > 0  # the logit of "2 after 1" goes up: p(chosen) rises


# ---- the other loss types of TRL's list ----------------------------------------------------------

sigmoid = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
B = 0.5  # beta of the cases below; chosen log-ratios c = [1, -0.5], rejected r = [0, 0.5], h = c - r = [1, -1]
PAIRS = list(zip(CHOSEN, REJECTED))
EPS = 0.1  # label smoothing of the smoothed losses
EXO_EPS = 1e-3  # EXO's eps (the paper's value)


def hand_exo(h: float) -> float:
    q = sigmoid(B * h)  # softmax of beta [c, r] over the pair
    return q * (math.log(q) - math.log(1 - EXO_EPS)) + (1 - q) * (math.log(1 - q) - math.log(EXO_EPS))


def hand_discopop(h: float, tau: float = 0.05) -> float:
    mix = sigmoid(B * h / tau)
    return (1 - mix) * neg_log_sigmoid(B * h) + mix * math.exp(-B * h)


HAND_PAIR_LOSSES = {  # loss_type: (options, per-pair formula of (c, r))
    "hinge": ({}, lambda c, r: max(0.0, 1 - B * (c - r))),
    "nca_pair": ({}, lambda c, r: neg_log_sigmoid(B * c) + 0.5 * neg_log_sigmoid(-B * c) + 0.5 * neg_log_sigmoid(-B * r)),
    "robust": ({"label_smoothing": EPS},
               lambda c, r: ((1 - EPS) * neg_log_sigmoid(B * (c - r)) - EPS * neg_log_sigmoid(-B * (c - r))) / (1 - 2 * EPS)),
    "exo_pair": ({"label_smoothing": EXO_EPS}, lambda c, r: hand_exo(c - r)),
    "bco_pair": ({}, lambda c, r: neg_log_sigmoid(B * c) + neg_log_sigmoid(-B * r)),
    "sppo_hard": ({}, lambda c, r: (c - 1 / (2 * B)) ** 2 + (r + 1 / (2 * B)) ** 2),  # (c - 1)^2 + (r + 1)^2
    "apo_zero": ({}, lambda c, r: 1 - sigmoid(B * c) + sigmoid(B * r)),
    "apo_down": ({}, lambda c, r: sigmoid(B * c) + 1 - sigmoid(B * (c - r))),
    "discopop": ({}, lambda c, r: hand_discopop(c - r)),
}


def pair_of(chosen_logratios, rejected_logratios, chosen_tokens=(1.0, 1.0), rejected_tokens=(1.0, 1.0)) -> PairLogps:
    """A pair batch whose reference log-probs are 0, so the policy log-probs are the log-ratios."""
    zeros = torch.zeros(len(chosen_logratios))
    return PairLogps(torch.tensor(chosen_logratios), torch.tensor(rejected_logratios), zeros, zeros,
                     torch.tensor(chosen_tokens), torch.tensor(rejected_tokens))


@pytest.mark.parametrize("loss_type", HAND_PAIR_LOSSES)
def test_every_pair_loss_matches_its_paper_formula(loss_type):
    options, formula = HAND_PAIR_LOSSES[loss_type]
    losses = pair_loss(loss_type, pair_of(CHOSEN, REJECTED), beta=B, **options)
    torch.testing.assert_close(losses, torch.tensor([formula(c, r) for c, r in PAIRS]))


def test_sppo_hard_hand_values():
    # beta 0.5: (c - 1)^2 + (r + 1)^2 = 0 + 1 for pair 0 and 2.25 + 2.25 for pair 1.
    torch.testing.assert_close(pair_loss("sppo_hard", pair_of(CHOSEN, REJECTED), beta=B), torch.tensor([1.0, 4.5]))


def test_aot_sorts_the_policy_and_reference_margins_of_the_batch():
    # Sorted policy margins [-1, 3] against sorted reference margins [0, 2]: deltas -1 and 1.
    losses = aot_loss(torch.tensor([3.0, -1.0]), torch.tensor([0.0, 2.0]), beta=B)
    torch.testing.assert_close(losses, torch.tensor([neg_log_sigmoid(-B), neg_log_sigmoid(B)]))
    # `aot` reads log pi(y_w) - log pi(y_l) and the reference's; `aot_unpaired` sorts c and r themselves.
    pair = PairLogps(torch.tensor([3.0, 0.0]), torch.tensor([0.0, 1.0]), torch.tensor([0.0, 2.0]),
                     torch.tensor([0.0, 0.0]), torch.ones(2), torch.ones(2))
    torch.testing.assert_close(pair_loss("aot", pair, beta=B), losses)  # margins [3, -1], ref [0, 2]
    # unpaired: c = [3, -2] sorted [-2, 3]; r = [0, 1] sorted [0, 1] -> deltas -2 and 2.
    torch.testing.assert_close(pair_loss("aot_unpaired", pair, beta=B),
                               torch.tensor([neg_log_sigmoid(-2 * B), neg_log_sigmoid(2 * B)]))


def test_sigmoid_norm_divides_each_log_ratio_by_its_response_length():
    # c = [1, -0.5] over [2, 1] tokens, r = [0, 0.5] over [1, 4] tokens: h = [0.5 - 0, -0.5 - 0.125].
    losses = pair_loss("sigmoid_norm", pair_of(CHOSEN, REJECTED, (2.0, 1.0), (1.0, 4.0)), beta=B)
    torch.testing.assert_close(losses, torch.tensor([hand_sigmoid(0.5, B), hand_sigmoid(-0.625, B)]))


def test_sft_loss_is_the_chosen_per_token_nll():
    losses = pair_loss("sft", pair_of([-2.0, -3.0], [0.0, 0.0], (2.0, 3.0)), beta=B)
    torch.testing.assert_close(losses, torch.tensor([1.0, 1.0]))


def test_every_loss_type_runs_through_the_objective_and_only_reference_free_ones_skip_the_reference():
    for loss_type in LOSS_TYPES:
        objective = DPOObjective(beta=B, loss_type=loss_type, label_smoothing=EXO_EPS if loss_type == "exo_pair" else 0)
        output = objective(BigramLM(POLICY), preference_batch(ref_logps=REF_LOGPS))
        assert torch.isfinite(output.total), loss_type
        assert objective.needs_reference == (loss_type not in ("simpo", "sft")), loss_type


def test_a_list_of_loss_types_adds_their_losses_with_their_weights():
    batch = preference_batch(ref_logps=REF_LOGPS)
    parts = {name: DPOObjective(beta=B, loss_type=name)(BigramLM(POLICY), batch).total for name in ("sigmoid", "sft")}
    combined = DPOObjective(beta=B, loss_type=["sigmoid", "sft"], loss_weights=[0.8, 0.2])(BigramLM(POLICY), batch)
    torch.testing.assert_close(combined.total, 0.8 * parts["sigmoid"] + 0.2 * parts["sft"])
    torch.testing.assert_close(parts["sft"], torch.tensor(CHOSEN_NLL))  # the SFT term is the chosen NLL
    unweighted = DPOObjective(beta=B, loss_type=["sigmoid", "sft"])(BigramLM(POLICY), batch)
    torch.testing.assert_close(unweighted.total, parts["sigmoid"] + parts["sft"])
    with pytest.raises(ValueError, match="1 loss_weights for 2 loss types"):
        DPOObjective(beta=B, loss_type=["sigmoid", "sft"], loss_weights=[1.0])
