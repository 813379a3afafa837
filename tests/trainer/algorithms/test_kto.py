"""Tests for the KTO losses and `KTOObjective` in `trainer.algorithms.kto`.

Policy and reference are bigram LMs whose logits after token i are log(W[i]), so p(j | i) = W[i][j] / sum(W[i]).
"""

import math

import pytest
import torch

from tests.trainer.algorithms.stand_ins import BigramLM
from trainer.algorithms.kto import KTOObjective, apo_zero_unpaired_loss, kl_reference_point, kto_loss
from trainer.data.collate import pad_unpaired
from trainer.data.tokenize import IGNORE_INDEX as X

LN2 = math.log(2)


def sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def test_kto_loss_matches_the_paper_per_row():
    # beta 0.5, z0 0.2; desirable row r = 1: 1 - sigmoid(0.4); undesirable row r = -1, weight 2: 2 (1 - sigmoid(0.6)).
    losses = kto_loss(torch.tensor([1.0, -1.0]), torch.tensor([1.0, 0.0]), torch.tensor(0.2), beta=0.5,
                      desirable_weight=1.0, undesirable_weight=2.0)
    torch.testing.assert_close(losses, torch.tensor([1 - sigmoid(0.4), 2 * (1 - sigmoid(0.6))]))


def test_apo_zero_unpaired_pushes_desirable_up_and_undesirable_down_without_a_reference_point():
    losses = apo_zero_unpaired_loss(torch.tensor([1.0, 1.0]), torch.tensor([1.0, 0.0]), beta=0.5)
    torch.testing.assert_close(losses, torch.tensor([1 - sigmoid(0.5), sigmoid(0.5)]))


def test_kl_reference_point_is_the_mean_log_ratio_clamped_at_zero():
    torch.testing.assert_close(kl_reference_point(torch.tensor([-1.0, -2.0]), torch.tensor([-1.5, -1.5])),
                               torch.tensor(0.0))  # mean 0
    torch.testing.assert_close(kl_reference_point(torch.tensor([-1.0, -1.0]), torch.tensor([-2.0, -1.5])),
                               torch.tensor(0.75))
    torch.testing.assert_close(kl_reference_point(torch.tensor([-3.0]), torch.tensor([-1.0])), torch.tensor(0.0))


# p(2|1) = 2/8, p(3|1) = 4/8, p(3|2) = 3/6 under the policy; the reference is uniform but p_ref(3|2) = 7/10.
POLICY = [[1, 1, 1, 97], [1, 1, 2, 4], [1, 1, 1, 3], [5, 1, 1, 1]]
REFERENCE = [[1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 7], [1, 1, 1, 1]]
# Row 0: prompt [1], desirable completion [2, 3]; row 1: prompt [1], undesirable completion [3].
EXAMPLES = [{"input_ids": [1, 2, 3], "labels": [X, 2, 3], "prompt_length": 1, "desirable": True},
            {"input_ids": [1, 3], "labels": [X, 3], "prompt_length": 1, "desirable": False}]
# Log-ratios: row 0 log(1/8) - log(1/4 * 7/10) = log(5/7); row 1 log(1/2) - log(1/4) = ln2.
# Mismatched pairs: [1] + [3] (ln2, as row 1) and [1] + [2, 3] (log(5/7), as row 0): z0 = (ln2 + log(5/7)) / 2.
LOGRATIOS = [math.log(5 / 7), LN2]
Z0 = (LN2 + math.log(5 / 7)) / 2


def test_pad_unpaired_pairs_each_prompt_with_the_previous_rows_completion():
    batch = pad_unpaired(EXAMPLES, pad_token_id=0, max_length=8)
    assert batch["kl_input_ids"].tolist() == [[1, 3, 0], [1, 2, 3]]
    assert batch["kl_labels"].tolist() == [[X, 3, X], [X, 2, 3]]
    assert batch["kl_attention_mask"].tolist() == [[1, 1, 0], [1, 1, 1]]
    assert batch["input_ids"].tolist() == [[1, 2, 3], [1, 3, 0]]
    assert batch["desirable"].tolist() == [1.0, 0.0]
    truncated = pad_unpaired(EXAMPLES, pad_token_id=0, max_length=2)  # the mismatched pair is cut to max_length
    assert truncated["kl_input_ids"].tolist() == [[1, 3], [1, 2]]


@pytest.mark.parametrize("loss_type", ["kto", "apo_zero_unpaired"])
def test_kto_objective_matches_hand_values(loss_type):
    batch = pad_unpaired(EXAMPLES, pad_token_id=0, max_length=8)
    objective = KTOObjective(beta=0.5, ref_model=BigramLM(REFERENCE), loss_type=loss_type, undesirable_weight=2.0)
    output = objective(BigramLM(POLICY), batch)
    if loss_type == "kto":
        expected = [1 - sigmoid(0.5 * (LOGRATIOS[0] - Z0)), 2 * (1 - sigmoid(0.5 * (Z0 - LOGRATIOS[1])))]
        kl = Z0
    else:
        expected = [1 - sigmoid(0.5 * LOGRATIOS[0]), 2 * sigmoid(0.5 * LOGRATIOS[1])]
        kl = 0.0
    torch.testing.assert_close(output.total, torch.tensor(sum(expected)))
    torch.testing.assert_close(output.count, torch.tensor(2.0))
    torch.testing.assert_close(output.stats["kl"], torch.tensor(2 * kl))  # summed per row, logged / rows
    # Row 0 (desirable) sits below z0 (and below 0), row 1 (undesirable) above both: neither is on its side.
    torch.testing.assert_close(output.stats["rewards/accuracies"], torch.tensor(0.0))
    swapped = pad_unpaired([{**e, "desirable": not e["desirable"]} for e in EXAMPLES], pad_token_id=0, max_length=8)
    torch.testing.assert_close(objective(BigramLM(POLICY), swapped).stats["rewards/accuracies"], torch.tensor(2.0))


def test_kto_gradient_flows_only_through_the_matched_rows():
    policy = BigramLM(POLICY)
    KTOObjective(beta=0.5, ref_model=BigramLM(REFERENCE))(policy, pad_unpaired(EXAMPLES, 0, 8)).total.backward()
    assert policy.table.weight.grad.abs().sum() > 0
    # z0 is a constant: the same loss with z0 frozen at its value has the same gradient.
    frozen = BigramLM(POLICY)
    logps = torch.stack([frozen.table.weight.log_softmax(-1)[1, 2] + frozen.table.weight.log_softmax(-1)[2, 3],
                         frozen.table.weight.log_softmax(-1)[1, 3]])
    reference = torch.tensor([math.log(1 / 4 * 7 / 10), math.log(1 / 4)])
    kto_loss(logps - reference, torch.tensor([1.0, 0.0]), torch.tensor(Z0), beta=0.5).sum().backward()
    torch.testing.assert_close(policy.table.weight.grad, frozen.table.weight.grad)
