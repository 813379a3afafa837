"""`train_step` skips a step whose loss or gradient norm is not finite; `NonFiniteGuard` ends a diverged run."""

from __future__ import annotations

import pytest
import torch

from trainer.algorithms.common import LossOutput
from trainer.algorithms.update import NonFiniteGuard, train_step
from trainer.errors import TrainingError
from trainer.parallel.booster import Booster, SinglePlugin
from trainer.runtime import DistributedEnv


class ScaledSum:
    """Loss = sum of the model's outputs times `batch["scale"]` (inf or NaN makes it non-finite)."""

    def count_units(self, batch):
        return torch.tensor(1.0)

    def __call__(self, model, batch):
        total = model(batch["x"]).sum() * batch["scale"]
        return LossOutput(total=total, count=torch.tensor(1.0), stats={"loss": total.detach()})


def setup():
    torch.manual_seed(0)
    booster = Booster(SinglePlugin(DistributedEnv(0, 0, 1), torch.device("cpu")))
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    booster.register_optimizer(model, optimizer)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    return booster, model, optimizer, scheduler


@pytest.mark.parametrize("scale", [float("nan"), float("inf")])
def test_non_finite_loss_skips_the_optimizer_step(scale):
    booster, model, optimizer, scheduler = setup()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    metrics = train_step(booster, model, optimizer, scheduler, [{"x": torch.ones(2, 3), "scale": scale}],
                         ScaledSum(), max_grad_norm=1.0)
    assert metrics["nonfinite"] == 1.0
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # untouched
    assert not optimizer.state  # AdamW never stepped: no moments
    assert all(p.grad is None for p in model.parameters())  # the bad gradients are dropped
    assert scheduler.last_epoch == 1  # the schedule stays in step with the loop


def test_non_finite_gradient_norm_with_a_finite_loss_skips_the_step():
    booster, model, optimizer, scheduler = setup()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    huge = torch.full((2, 3), 3e38)  # the loss is 0 * sum, but d/dW overflows to inf
    metrics = train_step(booster, model, optimizer, scheduler, [{"x": huge, "scale": 1e-30}], ScaledSum(), 1.0)
    assert metrics["nonfinite"] == 1.0
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_finite_step_updates_and_reports_no_skip():
    booster, model, optimizer, scheduler = setup()
    before = model.weight.clone()
    metrics = train_step(booster, model, optimizer, scheduler, [{"x": torch.ones(2, 3), "scale": 1.0}], ScaledSum(), 1.0)
    assert metrics["nonfinite"] == 0.0 and not torch.equal(model.weight, before)


def test_guard_counts_skips_and_fails_after_too_many_in_a_row():
    guard = NonFiniteGuard(max_in_a_row=2)
    for step, flag in enumerate([1.0, 0.0, 1.0, 1.0], start=1):
        guard.observe({"nonfinite": flag}, step)
    assert (guard.total, guard.in_a_row) == (3, 2)
    with pytest.raises(TrainingError, match=r"step 5: 3 optimizer steps in a row .*\(train.max_nonfinite_steps is 2\)"):
        guard.observe({"nonfinite": 1.0}, 5)


def test_guard_refuses_a_run_that_ends_inside_a_streak():
    guard = NonFiniteGuard(max_in_a_row=10)
    guard.observe({"nonfinite": 1.0}, 7)
    with pytest.raises(TrainingError, match="ended at step 7 after 1 optimizer step"):
        guard.check_end(7)
    guard.observe({"nonfinite": 0.0}, 8)
    guard.check_end(8)
