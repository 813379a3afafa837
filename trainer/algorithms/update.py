"""The one optimizer step every trainer path runs, and the matching evaluation pass.

A step's loss is the mean over all loss units (tokens or pairs) of the global batch: every
micro-batch's summed loss is divided by the unit count of the whole step across ranks, then
multiplied by the world size because data-parallel gradient reduction averages over ranks. One
process with the global batch and N processes with 1/N of it therefore take the same step.

A step whose loss (on any rank) or global gradient norm is not finite is skipped: no optimizer
update, gradients dropped, the learning-rate schedule still advances so the loop's step count and
the schedule stay in line. Its metrics carry `nonfinite: 1`; `NonFiniteGuard` counts such steps
for the loops and ends a run that keeps producing them.
"""

from __future__ import annotations

import contextlib
import logging
import math
import warnings
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from trainer.algorithms.common import LossOutput
from trainer.errors import TrainingError
from trainer.parallel.booster import Booster
from trainer.runtime import all_reduce_sum

logger = logging.getLogger(__name__)


class Objective(Protocol):
    def count_units(self, batch: dict[str, Tensor]) -> Tensor: ...

    def __call__(self, model: nn.Module, batch: dict[str, Tensor]) -> LossOutput: ...


def to_device(batch: dict[str, Tensor], device: torch.device) -> dict[str, Tensor]:
    return {k: v.to(device) if isinstance(v, Tensor) else v for k, v in batch.items()}


def _reduce_stats(sums: dict[str, Tensor], count: Tensor, *totals: Tensor) -> tuple[dict[str, float], list[float]]:
    """Global means of summed statistics, and global sums of `totals`: one all-reduce of everything."""
    keys = sorted(sums)
    packed = all_reduce_sum(torch.stack([sums[k].float() for k in keys] + [count.float()]
                                        + [t.float().to(count.device) for t in totals]))
    total = packed[len(keys)].clamp(min=1)
    return {k: (packed[i] / total).item() for i, k in enumerate(keys)}, packed[len(keys) + 1:].tolist()


def train_step(booster: Booster, model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any,
               micro_batches: Sequence[dict[str, Tensor]], objective: Objective | Callable,
               max_grad_norm: float) -> dict[str, float]:
    """Accumulate gradients over `micro_batches`, clip, and take one optimizer step.

    Returns:
        Global means of the objective's statistics, plus `grad_norm`, `lr`, `num_units` and
        `nonfinite` (1.0 when the step was skipped for a non-finite loss or gradient norm).
    """
    device = booster.plugin.device
    micro_batches = [to_device(b, device) for b in micro_batches]
    local_units = torch.stack([objective.count_units(b).float().to(device) for b in micro_batches]).sum()
    global_units = all_reduce_sum(local_units.clone()).clamp(min=1)
    scale = booster.plugin.world_size / global_units
    sums: dict[str, Tensor] = {}
    nonfinite_losses = torch.zeros((), device=device)
    for index, batch in enumerate(micro_batches):
        is_last = index == len(micro_batches) - 1
        sync = booster.no_sync(model, optimizer) if not is_last else contextlib.nullcontext()
        with sync, booster.autocast():
            output = objective(model, batch)
            booster.backward(output.total * scale, optimizer)
        nonfinite_losses += (~torch.isfinite(output.total.detach())).float()
        for key, value in output.stats.items():
            sums[key] = sums.get(key, 0) + value.float()
    metrics, (num_nonfinite_losses,) = _reduce_stats(sums, local_units, nonfinite_losses)  # before stepping
    lr = optimizer.param_groups[0]["lr"]
    grad_norm = float("nan")
    if num_nonfinite_losses == 0:
        grad_norm = float(booster.step(model, optimizer, max_grad_norm))  # clips, then steps if the norm is finite
    optimizer.zero_grad(set_to_none=True)
    with warnings.catch_warnings():  # a skipped first step makes torch warn about the call order
        warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler.step\(\)` before")
        scheduler.step()
    metrics.update(grad_norm=grad_norm, lr=lr, num_units=float(global_units),
                   nonfinite=float(num_nonfinite_losses > 0 or not math.isfinite(grad_norm)))
    return metrics


class NonFiniteGuard:
    """Counts optimizer steps skipped for a non-finite loss or gradient norm, and ends a diverged run.

    Args:
        max_in_a_row: Skipped steps in a row that are tolerated (`train.max_nonfinite_steps`).
    """

    def __init__(self, max_in_a_row: int) -> None:
        self.max_in_a_row = max_in_a_row
        self.total = 0
        self.in_a_row = 0

    def restore(self, total: int, in_a_row: int) -> None:
        self.total, self.in_a_row = total, in_a_row

    def observe(self, metrics: dict[str, float], step: int) -> None:
        """Count the step if `train_step` skipped it; TrainingError after more than `max_in_a_row` in a row."""
        if not metrics.get("nonfinite"):
            self.in_a_row = 0
            return
        self.total += 1
        self.in_a_row += 1
        logger.warning("step %d: non-finite loss or gradient norm (loss %s, grad_norm %s); optimizer step skipped "
                       "(%d in a row, %d in all)", step, metrics.get("loss"), metrics.get("grad_norm"), self.in_a_row,
                       self.total)
        if self.in_a_row > self.max_in_a_row:
            raise TrainingError(f"step {step}: {self.in_a_row} optimizer steps in a row had a non-finite loss or "
                                f"gradient norm (train.max_nonfinite_steps is {self.max_in_a_row}); the run diverged "
                                "and is stopped without exporting: lower optimizer.lr or check the data")

    def check_end(self, step: int) -> None:
        """TrainingError if the run ends inside a streak of skipped steps: that model is not exported."""
        if self.in_a_row:
            raise TrainingError(f"the run ended at step {step} after {self.in_a_row} optimizer step(s) in a row with "
                                "a non-finite loss or gradient norm; its model is not exported: lower optimizer.lr "
                                "or check the data")


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
    return _reduce_stats(sums, count)[0] if sums else {}
