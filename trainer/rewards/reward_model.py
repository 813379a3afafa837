"""A trained reward model as a reward source: its value at each row's last response token."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn


class RewardModelScorer:
    """Scores sequences with a reward model's value at the last response token."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    @torch.no_grad()
    def __call__(self, batch: dict[str, Tensor], prompts: list[str], completions: list[str],
                 answers: list[Any]) -> Tensor:
        values = self.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                            position_ids=batch["position_ids"])  # (B, T)
        # Responses are right-padded after left-padded prompts, so "last non-pad" is the last action.
        return _last_action_values(values, batch["action_mask"])


def _last_action_values(values: Tensor, action_mask: Tensor) -> Tensor:
    """(B, T) values at each row's last response token -> (B,)."""
    positions = torch.arange(action_mask.shape[1], device=action_mask.device)
    last = (action_mask * positions).argmax(dim=1)
    return values.gather(1, last.unsqueeze(1)).squeeze(1).float()
