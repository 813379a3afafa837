"""The learning-rate schedule: linear warmup, then cosine, linear or constant decay to min_lr_ratio."""

from __future__ import annotations

import math

import pytest
import torch

from trainer.config import OptimizerConfig
from trainer.modeling.optim import build_optimizer, lr_multiplier


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


def test_adamw_runs_fused_on_plain_parameters_and_matches_the_per_parameter_loop():
    torch.manual_seed(0)
    fused_model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 2))
    loop_model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 2))
    loop_model.load_state_dict(fused_model.state_dict())
    config = OptimizerConfig(lr=1e-2, weight_decay=0.1)
    fused = build_optimizer(fused_model, config)
    loop = torch.optim.AdamW([{"params": [p for p in loop_model.parameters() if p.ndim >= 2], "weight_decay": 0.1},
                              {"params": [p for p in loop_model.parameters() if p.ndim < 2], "weight_decay": 0.0}],
                             lr=1e-2, foreach=False)
    assert fused.defaults["fused"] is True
    inputs = torch.randn(16, 4)
    for _ in range(3):
        for model, optimizer in ((fused_model, fused), (loop_model, loop)):
            optimizer.zero_grad()
            model(inputs).square().mean().backward()
            optimizer.step()
    for left, right in zip(fused_model.parameters(), loop_model.parameters()):
        torch.testing.assert_close(left, right, rtol=1e-5, atol=1e-6)


def test_adamw_falls_back_to_foreach_where_no_fused_kernel_applies():
    model = torch.nn.Linear(3, 3).to(torch.float64)  # fused AdamW takes float32/16 and bfloat16 only
    optimizer = build_optimizer(model, OptimizerConfig())
    assert optimizer.defaults["foreach"] is True and not optimizer.defaults["fused"]
