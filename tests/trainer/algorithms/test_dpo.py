"""Tests for the preference losses and `DPOObjective` in `trainer.algorithms.dpo`.

The policy is a bigram LM whose logits after token i are log(W[i]), so p(j | i) = W[i][j] / sum(W[i]).
"""

import math

import pytest
import torch

from tests.trainer.algorithms.stand_ins import BigramLM
from trainer.algorithms.dpo import DPOObjective, chosen_nll_loss, ipo_loss, sigmoid_preference_loss, simpo_loss
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
