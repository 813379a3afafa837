"""What a rollout asks of a scorer, and the one place where a list of scores becomes a tensor.

A `Scorer` is called with the sampled batch and its decoded text and returns (B,) scores on the
batch's device. Reward models read the batch's tokens; most other sources (reward functions,
verifiable checks, services, judges, code tests) work out one float per row from the text:
they subclass `RowScorer`, write `score`, and get the tensor from `scores_tensor`.

Left out: which sources a run has and how they are weighted (`trainer.rewards.weighted`), and how
each source computes its scores (`trainer.rewards`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, Protocol

import torch
from torch import Tensor


class Scorer(Protocol):
    """Scores a rollout's rows."""

    def __call__(self, batch: dict[str, Tensor], prompts: list[str], completions: list[str],
                 answers: list[Any]) -> Tensor:
        """(B,) scores of the rows.

        Args:
            batch: The sampled sequences: input_ids, attention_mask, action_mask, position_ids, each (B, P + R).
            prompts: Each row's prompt as text.
            completions: Each row's decoded response (a multi-turn episode's last turn).
            answers: Each row's `answer` column, None where it has none.
        """


def scores_tensor(scores: Sequence[float], batch: dict[str, Tensor]) -> Tensor:
    """`scores` as the (B,) float32 tensor a rollout expects, on the batch's device."""
    return torch.tensor(scores, dtype=torch.float32, device=batch["input_ids"].device)  # (B,)


class RowScorer(ABC):
    """A scorer that works out one float per row from the text; `__call__` returns them as the tensor."""

    @abstractmethod
    def score(self, prompts: list[str], completions: list[str], answers: list[Any]) -> list[float]:
        """One score per row (the arguments as `Scorer.__call__` names them)."""

    def __call__(self, batch: dict[str, Tensor], prompts: list[str], completions: list[str],
                 answers: list[Any]) -> Tensor:
        return scores_tensor(self.score(prompts, completions, answers), batch)
