"""The objectives and batches `ranks_driver.py` trains on 2 ranks and `test_two_ranks.py` on one process.

Four GRPO rows whose responses have 2, 3, 1 and 0 active tokens (the last dropped, as dynamic sampling or
`mask_truncated_completions` drop a row), with ratios off 1 so the clip and the weights act; and four
preference pairs for a DPO loss list and ORPO. Apart from those, each rank's two unpaired rows for KTO, whose
reference point z0 is estimated over the ranks.
"""

from __future__ import annotations

import math

import torch

from tests.trainer.algorithms.stand_ins import BigramLM
from trainer.algorithms.dpo import DPOObjective
from trainer.algorithms.grpo import GRPOObjective
from trainer.algorithms.kto import KTOObjective
from trainer.algorithms.orpo import ORPOObjective
from trainer.data.collate import pad_unpaired
from trainer.data.tokenize import IGNORE_INDEX as X

POLICY_WEIGHTS = [[1, 1, 1, 1], [1, 1, 2, 4], [1, 1, 1, 3], [5, 1, 1, 1]]
GRPO_MASK = [[0, 0, 1, 1], [0, 1, 1, 1], [0, 0, 0, 1], [0, 0, 0, 0]]
GRPO_BATCH = {
    "input_ids": torch.tensor([[0, 1, 2, 3], [1, 3, 3, 0], [2, 3, 0, 1], [0, 0, 1, 2]]),
    "attention_mask": torch.ones(4, 4, dtype=torch.long),
    "action_mask": torch.tensor([[0, 0, 1, 1], [0, 1, 1, 1], [0, 0, 0, 1], [0, 0, 1, 1]]),
    "loss_mask": torch.tensor(GRPO_MASK),
    # old log-probs a little off the policy's, so ratios are 1.5, 0.5, 1.1 and the clip acts on some tokens.
    "old_logps": torch.tensor([[0.0, 0.0, math.log(1 / 4) - math.log(1.5), math.log(1 / 2) - math.log(1.5)],
                               [0.0, math.log(1 / 2) + math.log(2), math.log(1 / 8) + math.log(2), 0.0],
                               [0.0, 0.0, 0.0, math.log(1 / 4) - math.log(1.1)], [0.0] * 4]),
    "ref_logps": torch.zeros(4, 4),
    "advantages": torch.tensor([[0.0, 0.0, 1.0, 1.0], [0.0, -0.5, -0.5, -0.5], [0.0, 0.0, 0.0, 2.0], [0.0, 0.0, 3.0, 3.0]]),
}
# Pairs: chosen rows then rejected rows, each [1, a, b] with the label on a and b (one forward scores all 8).
PAIR_IDS = [[1, 2, 3], [1, 3, 3], [2, 1, 2], [3, 0, 1], [1, 3, 0], [1, 2, 2], [2, 2, 3], [3, 3, 3]]
PREFERENCE_BATCH = {
    "input_ids": torch.tensor(PAIR_IDS), "labels": torch.tensor([[X, a, b] for _, a, b in PAIR_IDS]),
    "attention_mask": torch.ones(8, 3, dtype=torch.long), "margin": torch.zeros(4),
    "ref_logps": torch.tensor([-2.0, -1.5, -3.0, -2.5, -1.0, -2.0, -2.0, -3.5]),
}


def grpo(loss_type: str, **options) -> GRPOObjective:
    return GRPOObjective(epsilon=0.2, epsilon_high=options.pop("epsilon_high", 0.28), beta=0.1, loss_type=loss_type,
                         max_completion_length=4, **options)


CASES = {  # name: (objective, global batch, its unit: "row" or "pair")
    **{loss: (grpo(loss), GRPO_BATCH, "row") for loss in ("grpo", "dr_grpo", "dapo", "sapo", "vespo")},
    "cispo": (grpo("cispo", epsilon_high=1.2), GRPO_BATCH, "row"),
    "gspo": (grpo("grpo", importance_sampling_level="sequence"), GRPO_BATCH, "row"),
    "luspo": (grpo("luspo", importance_sampling_level="sequence"), GRPO_BATCH, "row"),
    "dpo_list": (DPOObjective(beta=0.5, loss_type=["sigmoid", "bco_pair", "sft"], loss_weights=[0.8, 0.2, 1.0]),
                 PREFERENCE_BATCH, "pair"),
    "orpo": (ORPOObjective(beta=0.5), PREFERENCE_BATCH, "pair"),
}


def split_rows(batch: dict, unit: str) -> list[dict]:
    """The batch as 4 one-row (or one-pair) batches, in order."""
    if unit == "row":
        return [{key: value[i:i + 1] for key, value in batch.items()} for i in range(4)]
    pairs = []
    for i in range(4):
        rows = [i, i + 4]  # the pair's chosen and rejected rows
        pairs.append({key: value[rows] if key != "margin" else value[i:i + 1] for key, value in batch.items()})
    return pairs


# KTO: rank 0's mismatched pairs score lower under the policy than under the reference (log-ratio log 1/2 each),
# rank 1's higher (log 5/2 each), so rank 0's own z0 would clamp to 0, rank 1's would be log 5/2, and the mean of
# the ranks' means before the clamp is (log 5/2 - log 2) / 2 (the mean of the clamped values would be larger).
KTO_REFERENCE_WEIGHTS = [[1, 1, 1, 1]] * 4  # uniform


def kto_objective() -> KTOObjective:
    return KTOObjective(beta=0.5, ref_model=BigramLM(KTO_REFERENCE_WEIGHTS))


def kto_rank_batch(rank: int) -> dict:
    """Rank `rank`'s micro-batch of two unpaired rows (prompt [1] or [3], then a completion)."""
    completions = [[0], [1]] if rank == 0 else [[0], [0]]
    prompt = 1 if rank == 0 else 3
    rows = [{"input_ids": [prompt, *c], "labels": [X, *c], "prompt_length": 1, "desirable": i == 0}
            for i, c in enumerate(completions)]
    return pad_unpaired(rows, pad_token_id=0, max_length=8)
