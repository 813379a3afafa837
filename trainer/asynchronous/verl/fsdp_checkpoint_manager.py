"""`FSDPCheckpointManager`: one worker's share of checkpoints and weight publishing, and `CheckpointMonitor`.

Seed: `trinity/trainer/verl/fsdp_checkpoint_manager.py` and the `CheckpointMonitor` of
`verl_trainer.py`. The three ways a worker hands out weights are three different acts, kept under
the seed's names:

- `upload_state_dict(step)`: the full policy state dict to the in-process `Synchronizer`, for an
  explorer thread in this process (the seed's "memory" sync method; like the next, refused with a
  TrainingError when a weight is not finite: explorers never generate with a diverged policy);
- `save_state_dict(step)`: the policy alone as weight version `step` in the weights directory,
  for explorer processes (the seed's "checkpoint" sync method; `trainer.asynchronous.weights`);
- `save_checkpoint(step, ...)`: a resumable checkpoint (model, optimizer, scheduler, RNG, loop
  state) through `trainer.checkpointing.checkpoint.CheckpointManager`; `wait_on_save_thread` joins its
  background write.

The seed's `CheckpointMonitor` marks a step "latest" only once every worker's save threads for it
have finished. Here each worker registers its parts for a step and the monitor writes them as one
`step-N` directory when the last role has registered, so the atomic-checkpoint rule of
`trainer.checkpointing.checkpoint` holds for actor and critic together, and a run can resume from the result in
either mode.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from trainer.asynchronous.synchronizer import Synchronizer
from trainer.asynchronous.weights import publish_weights
from trainer.checkpointing.checkpoint import CheckpointManager, ModelParts, copy_tensors
from trainer.lifecycle.context import check_finite
from trainer.parallel.booster import Booster

logger = logging.getLogger(__name__)


class CheckpointMonitor:
    """Collects each role's parts for a step and saves them together once every role has registered.

    Args:
        checkpoints: The run's checkpoint manager.
        roles: The roles that make up a complete checkpoint (`actor`, and `critic` for PPO).
    """

    def __init__(self, checkpoints: CheckpointManager, roles: set[str]) -> None:
        self.checkpoints = checkpoints
        self.roles = set(roles)
        self._pending: dict[int, dict[str, tuple[ModelParts, dict[str, Any]]]] = {}

    def register(self, role: str, parts: ModelParts, step: int, state: dict[str, Any] | None, block: bool) -> bool:
        """Add `role`'s parts (and loop state) for `step`; save when it completes the set. True if saved."""
        pending = self._pending.setdefault(step, {})
        pending[role] = (parts, dict(state or {}))
        if set(pending) != self.roles:
            return False
        del self._pending[step]
        merged: dict[str, Any] = {}
        for _, role_state in pending.values():
            merged.update(role_state)
        self.checkpoints.save({name: parts for name, (parts, _) in pending.items()}, merged, step, block=block)
        return True


class FSDPCheckpointManager:
    """Checkpoints and weight publishing of one role's model.

    Args:
        role: Component name in checkpoints (`actor` or `critic`).
        booster: The booster the model was boosted with (gathers full state dicts).
        parts: (model, optimizer, scheduler).
        monitor: Joins this role's checkpoint with the other roles' of the same step.
        weights_dir: Where `save_state_dict` publishes versions (the policy only).
        synchronizer: Where `upload_state_dict` puts versions (an explorer in this process).
    """

    def __init__(self, role: str, booster: Booster, parts: ModelParts, monitor: CheckpointMonitor,
                 weights_dir: str | None = None, synchronizer: Synchronizer | None = None) -> None:
        self.role = role
        self.booster = booster
        self.model, self.optimizer, self.lr_scheduler = parts
        self.monitor = monitor
        self.weights_dir = weights_dir
        self.synchronizer = synchronizer
        monitor.checkpoints.boosters[role] = booster  # the shared manager saves this role with its booster

    @property
    def parts(self) -> ModelParts:
        return self.model, self.optimizer, self.lr_scheduler

    def _full_state_dict(self) -> dict[str, torch.Tensor]:
        return self.booster.full_state_dict(self.model)  # a collective under FSDP2: every rank calls it

    def _publishable_state_dict(self, version: int) -> dict[str, torch.Tensor]:
        """The full state dict, checked finite (TrainingError naming the first bad tensor otherwise)."""
        state = self._full_state_dict()
        if self.booster.plugin.is_main_process:
            check_finite({f"{self.role} (weight version {version})": state})
        return state

    def upload_state_dict(self, global_step: int) -> None:
        """Give the in-process synchronizer a copy of the full state dict as version `global_step`."""
        if self.synchronizer is None:
            raise RuntimeError(f"{self.role}: upload_state_dict needs a Synchronizer (an explorer in this process)")
        self.synchronizer.set_model_state_dict(copy_tensors(self._publishable_state_dict(global_step)), global_step)

    def save_state_dict(self, global_step: int) -> str | None:
        """Publish the full state dict as weight version `global_step` in `weights_dir` (rank 0 writes)."""
        if self.weights_dir is None:
            raise RuntimeError(f"{self.role}: save_state_dict needs a weights directory")
        state = self._publishable_state_dict(global_step)
        if not self.booster.plugin.is_main_process:
            return None
        return publish_weights(self.weights_dir, state, global_step)

    def save_checkpoint(self, global_step: int, state: dict[str, Any] | None = None, block: bool = False) -> None:
        """Register this role's parts (and loop `state`) for checkpoint `step-<global_step>`; written in
        the background unless `block`, once every role of the run has registered."""
        self.monitor.register(self.role, self.parts, global_step, state, block)

    def load_checkpoint(self, directory: str) -> dict[str, Any]:
        """Restore this role's model, optimizer and scheduler (and the RNG) from a checkpoint; its loop state."""
        return self.monitor.checkpoints.load(directory, {self.role: self.parts})

    def wait_on_save_thread(self) -> None:
        """Block until a background checkpoint write has finished."""
        self.monitor.checkpoints.wait()
