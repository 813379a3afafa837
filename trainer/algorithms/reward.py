"""Reward modelling: a scalar head read at each sequence's last token, trained with Bradley-Terry.

Batches come packed (`pack_preference`: the read is at `last_positions`) or right-padded
(`pad_preference`: the read is at the last non-pad token); both give the same rewards.

Loss per pair (Ouyang et al. 2022, eq. 1; margin as in Llama 2, Touvron et al. 2023, eq. 2):
    -log sigmoid(r_chosen - r_rejected - margin)

Logged metrics: `loss`, `accuracy` (share of pairs with r_chosen > r_rejected),
`rewards/chosen`, `rewards/rejected`, `rewards/margins` (mean r_chosen - r_rejected).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from trainer.algorithms.common import LossOutput, packed_inputs


def bradley_terry_loss(chosen_rewards: Tensor, rejected_rewards: Tensor, margin: Tensor | None = None) -> Tensor:
    """Per-pair Bradley-Terry loss. Inputs (B,); returns (B,)."""
    difference = chosen_rewards - rejected_rewards  # (B,)
    if margin is not None:
        difference = difference - margin
    return -F.logsigmoid(difference)


def last_token_values(values: Tensor, attention_mask: Tensor) -> Tensor:
    """Value at the last non-pad token of each right-padded row. (B, T), (B, T) -> (B,)."""
    last = attention_mask.sum(-1).long() - 1  # (B,)
    return values.gather(1, last.clamp(min=0).unsqueeze(1)).squeeze(1)


class RewardObjective:
    """Scores chosen and rejected rows of a preference batch in one forward pass."""

    def __init__(self, *, use_margin: bool = True) -> None:
        self.use_margin = use_margin

    def count_units(self, batch: dict[str, Tensor]) -> Tensor:
        return torch.tensor(float(batch["margin"].shape[0]))

    def score(self, model: nn.Module, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        """Rewards of the chosen and rejected sequences, (B,) each; the batch is packed or padded."""
        if "last_positions" in batch:  # pack_preference: one row of whole sequences
            values = model(**packed_inputs(batch))  # (1, N)
            rewards = values.reshape(-1)[batch["last_positions"]].float()  # (2B,)
        else:  # pad_preference: one right-padded sequence per row
            values = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])  # (2B, T)
            rewards = last_token_values(values, batch["attention_mask"]).float()  # (2B,)
        return rewards.chunk(2)

    def __call__(self, model: nn.Module, batch: dict[str, Tensor]) -> LossOutput:
        chosen, rejected = self.score(model, batch)  # (B,), (B,)
        losses = bradley_terry_loss(chosen, rejected, batch["margin"] if self.use_margin else None)
        detached = (chosen - rejected).detach()
        stats = {
            "loss": losses.detach().sum(),
            "accuracy": (detached > 0).float().sum(),
            "rewards/chosen": chosen.detach().sum(),
            "rewards/rejected": rejected.detach().sum(),
            "rewards/margins": detached.sum(),
        }
        return LossOutput(total=losses.sum(), count=self.count_units(batch), stats=stats)
