"""One training step's data: `DataProto`, `to_data_proto` and `compute_data_metrics`.

Seed: `trinity/trainer/verl/utils.py` turns a list of Trinity `Experience`s into verl's
`DataProto` (a TensorDict `batch` plus `meta_info`, with `model_versions` per row). Here the
batch is the project's `Experience` (whose `select`/`split`/`to` serve as the TensorDict's), and
`meta_info` keeps the seed's keys that mean something here: `model_versions` and
`global_token_num`. Workers return new tensors as a dict keyed by `Experience` field name, which
`DataProto.union` adds (the seed returns a `DataProto` and calls `batch.union(output)`).

Metrics of `compute_data_metrics` (the seed's names; sequence statistics over the batch,
token statistics over response tokens):
`critic/score/{mean,max,min}` (sequence scores), `critic/rewards/{mean,max,min}` (sum of
per-token rewards, PPO), `critic/advantages/{mean,max,min}`, `critic/returns/{mean,max,min}` and
`critic/values/{mean,max,min}` (PPO), `response_length/{mean,max,min,clip_ratio}` (clip_ratio:
share of responses that used the whole `max_response_length`), `prompt_length/{mean,max,min}`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import Tensor

from trainer.online.batches import to_device
from trainer.rollout.experience import Experience, concat_experiences


@dataclass
class DataProto:
    """A batch of experience rows and facts about it.

    Attributes:
        batch: The rows, (B, T) tensors (see `Experience`).
        meta_info: `model_versions` (B,) long: weight version that generated each row;
            `global_token_num`: int, real tokens in the batch.
    """

    batch: Experience
    meta_info: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.batch)

    def union(self, tensors: dict[str, Tensor]) -> DataProto:
        """A copy with `tensors` (Experience field name -> (B, T) tensor) set on the batch."""
        return DataProto(replace(self.batch, **tensors), self.meta_info)

    def to(self, device: torch.device, pin_memory: bool = False) -> DataProto:
        return DataProto(to_device(self.batch, device, pin_memory), self.meta_info)


def to_data_proto(experiences: list[Experience], pad_token_id: int) -> DataProto:
    """Concatenate experience batches (right-padded to the longest) into one `DataProto`."""
    if not experiences:
        raise ValueError("to_data_proto needs at least one experience batch")
    batch = concat_experiences(experiences, pad_token_id)
    versions = torch.cat([torch.full((len(e),), e.version, dtype=torch.long) for e in experiences])  # (B,)
    return DataProto(batch, {"model_versions": versions, "global_token_num": int(batch.attention_mask.sum())})


def _stats(name: str, values: Tensor) -> dict[str, float]:
    values = values.float()
    if values.numel() == 0:
        return {}
    return {f"{name}/mean": values.mean().item(), f"{name}/max": values.max().item(), f"{name}/min": values.min().item()}


def compute_data_metrics(data: DataProto, max_response_length: int | None = None) -> dict[str, float]:
    """Score, reward, advantage, return, value and length statistics of a batch (keys in the module docstring)."""
    batch = data.batch
    mask = batch.action_mask.bool()  # (B, T)
    response_length = batch.action_mask.sum(-1)  # (B,)
    metrics = _stats("critic/score", batch.scores)
    if batch.rewards is not None:
        metrics |= _stats("critic/rewards", (batch.rewards * mask).sum(-1))
    for name in ("advantages", "returns", "values"):
        tensor = getattr(batch, name)
        if tensor is not None:
            metrics |= _stats(f"critic/{name}", tensor[mask])
    metrics |= _stats("response_length", response_length)
    if max_response_length is not None:
        metrics["response_length/clip_ratio"] = (response_length >= max_response_length).float().mean().item()
    metrics |= _stats("prompt_length", batch.attention_mask.sum(-1) - response_length)
    return metrics
