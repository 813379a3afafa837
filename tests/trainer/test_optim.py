"""The learning-rate schedule: linear warmup, then cosine, linear or constant decay to min_lr_ratio."""

from __future__ import annotations

import math

import pytest
import torch

from trainer.config import OptimizerConfig
from trainer.optim import build_optimizer, lr_multiplier


def test_warmup_rises_linearly_to_the_peak():
    # Step s < warmup gives (s + 1) / (warmup + 1): 1/5, 2/5, 3/5, 4/5 for warmup 4.
    values = [lr_multiplier(s, total_steps=10, warmup_steps=4, scheduler="cosine", min_lr_ratio=0.0) for s in range(4)]
    assert values == pytest.approx([0.2, 0.4, 0.6, 0.8])


def test_cosine_decays_to_min_ratio():
    # After warmup 2 of 10 steps, progress p = (s - 2) / 8; multiplier = 0.1 + 0.9 * (1 + cos(pi p)) / 2.
    at = {s: lr_multiplier(s, total_steps=10, warmup_steps=2, scheduler="cosine", min_lr_ratio=0.1) for s in (2, 6, 10)}
    assert at[2] == pytest.approx(1.0)
    assert at[6] == pytest.approx(0.1 + 0.9 * (1 + math.cos(math.pi * 0.5)) / 2)  # 0.55
    assert at[10] == pytest.approx(0.1)


def test_linear_and_constant_schedules():
    assert lr_multiplier(5, total_steps=10, warmup_steps=0, scheduler="linear", min_lr_ratio=0.0) == pytest.approx(0.5)
    assert lr_multiplier(9, total_steps=10, warmup_steps=0, scheduler="constant", min_lr_ratio=0.0) == 1.0


def test_optimizer_skips_weight_decay_on_biases_and_frozen_parameters():
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.LayerNorm(3))
    model[1].requires_grad_(False)
    optimizer = build_optimizer(model, OptimizerConfig(lr=1e-3, weight_decay=0.1))
    decays = {id(p): group["weight_decay"] for group in optimizer.param_groups for p in group["params"]}
    assert decays == {id(model[0].weight): 0.1, id(model[0].bias): 0.0}
