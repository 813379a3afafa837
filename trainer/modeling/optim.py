"""AdamW and the warmup + decay learning-rate schedule.

AdamW runs as one fused kernel over all parameters where torch has one for them (plain float
tensors on CPU or CUDA), else as the multi-tensor `foreach` implementation (DTensor parameters under
FSDP2, other devices). Both compute the same update as the per-parameter loop, which torch picks
by default on CPU; `tests/trainer/test_optim.py` checks that they agree.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from trainer.config import OptimizerConfig


def build_optimizer(model: nn.Module, config: OptimizerConfig) -> torch.optim.Optimizer:
    """AdamW over the trainable parameters; biases and norms get no weight decay."""
    decay, no_decay = [], []
    for parameter in model.parameters():
        if parameter.requires_grad:
            (decay if parameter.ndim >= 2 else no_decay).append(parameter)
    groups = [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    kernel = {"fused": True} if can_fuse(decay + no_decay) else {"foreach": True}
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=config.lr, betas=config.betas, eps=config.eps,
                             **kernel)


FUSED_DEVICES = ("cpu", "cuda")
FUSED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def can_fuse(parameters: list[torch.Tensor]) -> bool:
    """Whether torch's fused AdamW takes these parameters: plain float tensors, all on one CPU or CUDA device."""
    if not parameters:
        return False
    devices = {parameter.device for parameter in parameters}
    return (len(devices) == 1 and next(iter(devices)).type in FUSED_DEVICES
            and all(type(p) is torch.nn.Parameter and p.dtype in FUSED_DTYPES for p in parameters))


def lr_multiplier(step: int, *, total_steps: int, warmup_steps: int, scheduler: str, min_lr_ratio: float) -> float:
    """Factor on the peak lr at `step`: linear warmup, then cosine, linear or constant decay."""
    if step < warmup_steps:
        return (step + 1) / (warmup_steps + 1)
    if scheduler == "constant":
        return 1.0
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    if scheduler == "cosine":
        decay = 0.5 * (1 + math.cos(math.pi * progress))
    else:
        decay = 1 - progress
    return min_lr_ratio + (1 - min_lr_ratio) * decay


def build_scheduler(optimizer: torch.optim.Optimizer, config: OptimizerConfig, total_steps: int):
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda step: lr_multiplier(step, total_steps=total_steps, warmup_steps=config.warmup_steps,
                                   scheduler=config.scheduler, min_lr_ratio=config.min_lr_ratio),
    )
