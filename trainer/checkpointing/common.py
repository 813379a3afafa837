"""What both checkpoint writers share: the names in a checkpoint directory and a few small helpers."""

from __future__ import annotations

import re
from typing import Any

import torch
import torch.distributed as dist

LATEST = "latest"
STATE_FILE = "trainer_state.json"
MANIFEST_FILE = "manifest.json"
STEP_NAME = re.compile(r"step-\d{8,}")

# (model, optimizer, lr scheduler) of one trained network.
ModelParts = tuple[torch.nn.Module, torch.optim.Optimizer, Any]


def gather_objects(obj: Any) -> list[Any]:
    """Every rank's `obj`, in rank order (just `[obj]` outside a process group)."""
    if not dist.is_initialized():
        return [obj]
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, obj)
    return gathered


def copy_tensors(obj: Any) -> Any:
    """A copy of nested dicts/lists/tuples in which every tensor is cloned."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    if isinstance(obj, dict):
        return {k: copy_tensors(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(copy_tensors(v) for v in obj)
    return obj


def one_line(err: BaseException) -> str:
    """The first line of an error's message (boto and torch errors can span many)."""
    return (str(err).strip().splitlines() or [type(err).__name__])[0]
