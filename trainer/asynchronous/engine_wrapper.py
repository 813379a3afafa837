"""`TrainEngineWrapper`: what the experience-driven `Trainer` (`trainer.asynchronous.engine`) needs from
a training backend (Trinity-RFT's abstract wrapper, plus `tracker` and `close`).

The interface only: the native implementation is `trainer.asynchronous.verl.verl_trainer.TorchTrainEngine`,
chosen by `trainer.asynchronous.wrapper_factory.get_trainer_wrapper`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from trainer.rollout.experience import Experience
from trainer.tracking.tracker import Tracker


class TrainEngineWrapper(ABC):
    """What the `Trainer` needs from a training backend (the seed's abstract methods, plus `tracker` and `close`)."""

    buffer_position: int = 0
    """Number of the last buffer batch consumed (trained on or rejected); checkpoints record it and
    `prepare` restores it, so a resumed trainer reads the batch after it."""
    num_rejected: int = 0
    """Batches rejected as too stale so far in the run (checkpointed with the position)."""

    def discardable_buffer_position(self) -> int:
        """Buffer batches up to this position are covered by durable checkpoints and may be deleted."""
        return 0

    @abstractmethod
    async def prepare(self) -> None:
        """Load models and optimizers, resume from the latest checkpoint, open the outputs."""

    @property
    @abstractmethod
    def train_step_num(self) -> int:
        """Trainer steps done so far (restored on resume); also the policy's weight version."""

    @abstractmethod
    async def train_step(self, batch_exps: list[Experience]) -> dict[str, float]:
        """Train on a batch of experiences; return the step's metrics."""

    @abstractmethod
    def save_checkpoint(self, block_until_saved: bool = False, save_as_hf: bool = False) -> None:
        """Save a resumable checkpoint (in the background unless `block_until_saved`); `save_as_hf` also
        exports the model(s) in Hugging Face format and publishes the run's outputs."""

    @abstractmethod
    def sync_weight(self) -> None:
        """Push the policy to explorers over a collective group (the seed's "nccl" sync method)."""

    @abstractmethod
    def upload_state_dict(self) -> None:
        """Hand the policy's full state dict to the in-process synchronizer (the seed's "memory" sync)."""

    @abstractmethod
    def save_state_dict(self) -> None:
        """Publish the policy as a numbered version in the weights directory (the seed's "checkpoint" sync)."""

    @property
    @abstractmethod
    def tracker(self) -> Tracker:
        """Where the run's metrics go (valid after `prepare`)."""

    @abstractmethod
    def close(self) -> None:
        """Wait for background saves and close the tracker."""
