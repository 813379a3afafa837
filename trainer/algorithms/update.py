"""The one optimizer step every trainer path runs, and the matching evaluation pass.

A step's loss is the mean over all loss units (tokens or pairs) of the global batch: every
micro-batch's summed loss is divided by the unit count of the whole step across ranks, then
multiplied by the world size because data-parallel gradient reduction averages over ranks. One
process with the global batch and N processes with 1/N of it therefore take the same step.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from trainer.algorithms.common import LossOutput
from trainer.booster import Booster
from trainer.runtime import all_reduce_sum


class Objective(Protocol):
    def count_units(self, batch: dict[str, Tensor]) -> Tensor: ...

    def __call__(self, model: nn.Module, batch: dict[str, Tensor]) -> LossOutput: ...


def to_device(batch: dict[str, Tensor], device: torch.device) -> dict[str, Tensor]:
    return {k: v.to(device) if isinstance(v, Tensor) else v for k, v in batch.items()}


def _reduce_stats(sums: dict[str, Tensor], count: Tensor) -> dict[str, float]:
    """Global means of summed statistics: one all-reduce of every sum and the count together."""
    keys = sorted(sums)
    packed = all_reduce_sum(torch.stack([sums[k].float() for k in keys] + [count.float()]))
    total = packed[-1].clamp(min=1)
    return {k: (packed[i] / total).item() for i, k in enumerate(keys)}


def train_step(booster: Booster, model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any,
               micro_batches: Sequence[dict[str, Tensor]], objective: Objective | Callable,
               max_grad_norm: float) -> dict[str, float]:
    """Accumulate gradients over `micro_batches`, clip, and take one optimizer step.

    Returns:
        Global means of the objective's statistics, plus `grad_norm`, `lr` and `num_units`.
    """
    device = booster.plugin.device
    micro_batches = [to_device(b, device) for b in micro_batches]
    local_units = torch.stack([objective.count_units(b).float().to(device) for b in micro_batches]).sum()
    global_units = all_reduce_sum(local_units.clone()).clamp(min=1)
    scale = booster.plugin.world_size / global_units
    sums: dict[str, Tensor] = {}
    for index, batch in enumerate(micro_batches):
        is_last = index == len(micro_batches) - 1
        sync = booster.no_sync(model, optimizer) if not is_last else contextlib.nullcontext()
        with sync, booster.autocast():
            output = objective(model, batch)
            booster.backward(output.total * scale, optimizer)
        for key, value in output.stats.items():
            sums[key] = sums.get(key, 0) + value.float()
    parameters = [p for p in model.parameters() if p.requires_grad]
    grad_norm = torch.nn.utils.clip_grad_norm_(parameters, max_grad_norm if max_grad_norm > 0 else float("inf"))
    lr = optimizer.param_groups[0]["lr"]
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    scheduler.step()
    metrics = _reduce_stats(sums, local_units)
    grad_norm = grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm
    metrics.update(grad_norm=float(grad_norm), lr=lr, num_units=float(global_units))
    return metrics


@torch.no_grad()
def evaluate(booster: Booster, model: nn.Module, batches: Any, objective: Objective) -> dict[str, float]:
    """Global means of the objective's statistics over every batch of every rank."""
    model.eval()
    sums: dict[str, Tensor] = {}
    count = torch.zeros((), device=booster.plugin.device)
    for batch in batches:
        batch = to_device(batch, booster.plugin.device)
        with booster.autocast():
            output = objective(model, batch)
        count += output.count.to(count.device)
        for key, value in output.stats.items():
            sums[key] = sums.get(key, 0) + value.float()
    model.train()
    return _reduce_stats(sums, count) if sums else {}
