"""Atomic, resumable checkpoints under `<output_dir>/checkpoints/`.

Layout of one checkpoint, `step-00000042/`: `model.pt`, `optimizer.pt`, `scheduler.pt`
(full state dicts, see `Booster`), `rng-rank<R>.pt` (each rank's python/numpy/torch RNG states)
and `trainer_state.json` (epoch, global step, samples consumed in the epoch). Only after all of
them exist does rank 0 replace the `latest` file (write to a temporary name, then rename), so a
reader never picks up a half-written checkpoint; a crash mid-save leaves the previous `latest`.
Older checkpoints are deleted only after a newer one is complete.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trainer.booster import Booster
from trainer.errors import CheckpointError
from trainer.runtime import barrier

logger = logging.getLogger(__name__)

LATEST = "latest"


@dataclass(slots=True)
class TrainerState:
    """Where the loop stands: the next epoch to run and how far into it the run got."""

    epoch: int = 0
    global_step: int = 0
    samples_in_epoch: int = 0
    """Samples of `epoch` already consumed, summed over all ranks."""
    world_size: int = 1


def capture_rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class CheckpointManager:
    """Saves and finds checkpoints of one run.

    Args:
        root: The run's checkpoint directory.
        booster: Writes model/optimizer/scheduler state for the run's plugin.
        keep_last: Number of complete checkpoints to keep (0 keeps all).
    """

    def __init__(self, root: Path, booster: Booster, keep_last: int = 0) -> None:
        self.root = root
        self.booster = booster
        self.keep_last = keep_last
        self.is_main_process = booster.plugin.is_main_process

    def latest(self) -> Path | None:
        """The newest complete checkpoint, or None. Directories without a `latest` pointer are ignored."""
        pointer = self.root / LATEST
        if not pointer.is_file():
            return None
        directory = self.root / pointer.read_text().strip()
        if not (directory / "trainer_state.json").is_file():
            raise CheckpointError(f"{pointer} names {directory.name}, which has no trainer_state.json")
        return directory

    def save(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any,
             state: TrainerState) -> Path:
        directory = self.root / f"step-{state.global_step:08d}"
        if self.is_main_process:
            if directory.exists():  # left by a crash before its `latest` was written
                shutil.rmtree(directory)
            directory.mkdir(parents=True)
        barrier()
        self.booster.save_model(model, directory / "model.pt")
        self.booster.save_optimizer(optimizer, directory / "optimizer.pt")
        self.booster.save_lr_scheduler(scheduler, directory / "scheduler.pt")
        torch.save(capture_rng_state(), directory / f"rng-rank{self.booster.plugin.rank}.pt")
        barrier()
        if self.is_main_process:
            (directory / "trainer_state.json").write_text(json.dumps(asdict(state)))
            temporary = self.root / f".{LATEST}.tmp"
            temporary.write_text(directory.name)
            os.replace(temporary, self.root / LATEST)
            self._apply_retention()
        barrier()
        logger.info("saved checkpoint %s", directory)
        return directory

    def load(self, directory: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
             scheduler: Any) -> TrainerState:
        """Restore model, optimizer, scheduler and this rank's RNG; return the loop position."""
        state = TrainerState(**json.loads((directory / "trainer_state.json").read_text()))
        self.booster.load_model(model, directory / "model.pt")
        self.booster.load_optimizer(optimizer, directory / "optimizer.pt")
        self.booster.load_lr_scheduler(scheduler, directory / "scheduler.pt")
        rng_file = directory / f"rng-rank{self.booster.plugin.rank}.pt"
        if rng_file.is_file():
            restore_rng_state(torch.load(rng_file, weights_only=False))
        else:
            logger.warning("%s has no RNG state for rank %d (world size changed); RNG not restored",
                           directory, self.booster.plugin.rank)
        logger.info("resumed from %s (epoch %d, step %d)", directory, state.epoch, state.global_step)
        return state

    def _apply_retention(self) -> None:
        if self.keep_last <= 0:
            return
        latest = (self.root / LATEST).read_text().strip()
        steps = sorted(p for p in self.root.glob("step-*") if p.is_dir())
        complete = [p for p in steps if (p / "trainer_state.json").is_file()]
        keep = {p.name for p in complete[-self.keep_last:]} | {latest}
        for path in steps:
            if path.name not in keep and path.name < latest:
                shutil.rmtree(path, ignore_errors=True)
