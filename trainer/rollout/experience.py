"""`Experience`: a batch of rollouts and everything the update needs to learn from it.

All tensors are (B, T) over prompt + response tokens (prompts left-padded, responses right-padded)
unless noted (`scores` and `truncated` are (B,)). Position t of `old_logps`/`ref_logps`/`values`/`advantages` refers to token t
(the action chosen after reading tokens < t); only positions with `action_mask` 1 matter.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

import torch
from torch import Tensor

TOKEN_FIELDS = ("input_ids", "attention_mask", "action_mask", "position_ids", "old_logps", "ref_logps",
                "values", "rewards", "advantages", "returns", "behaviour_logps", "importance_weights", "loss_mask")
ROW_FIELDS = ("scores", "truncated")


@dataclass
class Experience:
    input_ids: Tensor
    attention_mask: Tensor
    action_mask: Tensor
    position_ids: Tensor
    scores: Tensor
    """(B,) sequence scores from the reward source."""
    truncated: Tensor | None = None
    """(B,) 1.0 where the response hit `generation.max_new_tokens` without a stop token."""
    old_logps: Tensor | None = None
    """Log-probs under the policy at the start of the update (the proximal policy, Hilton et al. 2022):
    the one that generated the responses in the colocated loop, the trainer's current one in the
    asynchronous engine."""
    ref_logps: Tensor | None = None
    values: Tensor | None = None
    rewards: Tensor | None = None
    advantages: Tensor | None = None
    returns: Tensor | None = None
    behaviour_logps: Tensor | None = None
    """Log-probs under the explorer's weights that generated the responses (asynchronous path only)."""
    importance_weights: Tensor | None = None
    """Truncated per-token weights pi_old / pi_behaviour that correct stale experience (asynchronous path)."""
    loss_mask: Tensor | None = None
    """The response tokens the GRPO loss counts: `action_mask` without the rows dynamic sampling or
    `mask_truncated_completions` dropped (GRPO only; None counts every response token)."""
    version: int = 0
    """Weight version of the policy that generated it (the asynchronous path)."""
    info: dict[str, float] = field(default_factory=dict)

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def as_batch(self) -> dict[str, Tensor]:
        """The tensors an objective reads, by name."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if isinstance(getattr(self, f.name), Tensor)}

    def to(self, device: torch.device) -> Experience:
        return replace(self, **{k: v.to(device) for k, v in self.as_batch().items()})

    def select(self, indices: Tensor) -> Experience:
        return replace(self, **{k: v[indices] for k, v in self.as_batch().items()})

    def split(self, size: int) -> list[Experience]:
        return [self.select(torch.arange(start, min(start + size, len(self)))) for start in range(0, len(self), size)]


def _pad_right(tensor: Tensor, width: int, value: float) -> Tensor:
    return torch.nn.functional.pad(tensor, (0, width - tensor.shape[1]), value=value)


def concat_experiences(experiences: list[Experience], pad_token_id: int) -> Experience:
    """Stack experiences whose sequence lengths differ by right-padding them to the longest; `info` counts add up."""
    width = max(e.input_ids.shape[1] for e in experiences)
    merged = {}
    for name in TOKEN_FIELDS:
        parts = [getattr(e, name) for e in experiences]
        if any(p is None for p in parts):
            continue
        value = pad_token_id if name == "input_ids" else 0
        merged[name] = torch.cat([_pad_right(p, width, value) for p in parts])
    for name in ROW_FIELDS:
        parts = [getattr(e, name) for e in experiences]
        if all(p is not None for p in parts):
            merged[name] = torch.cat(parts)
    keys = {key for e in experiences for key, value in e.info.items() if isinstance(value, (int, float))}
    info = {key: float(sum(e.info.get(key, 0.0) for e in experiences)) for key in keys}
    return Experience(**merged, version=min(e.version for e in experiences), info=info)


class ReplayBuffer:
    """A list of experiences with the operations OLTrainer needs."""

    def __init__(self) -> None:
        self.items: list[Experience] = []

    def append(self, experience: Experience) -> None:
        self.items.append(experience)

    def clear(self) -> None:
        self.items.clear()

    def __len__(self) -> int:
        return len(self.items)
