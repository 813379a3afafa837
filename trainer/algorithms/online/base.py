"""`OnlineAlgorithm`: what an online algorithm declares to the loops that run it.

One GRPO step then reads loop -> rollout -> algorithm -> update: the loop samples and scores a batch
(`trainer.rollout`), fills in log-probs, asks the algorithm for its advantages and objectives,
and takes the step (`trainer.algorithms.update.train_step`). What differs between PPO and GRPO is
declared here once, per subclass:

- what it needs: a critic (`needs_critic`), a frozen reference (`needs_reference`), pretraining
  batches (`ptx_data_path`);
- its reward KL coefficient (`build_kl_controller`);
- its advantages (`compute_advantages`);
- its actor and critic objectives (`build_actor_objective`, `build_critic_objective`);
- the episode metrics of what its advantages counted (`counted_info`, `episode_metrics`).

Left out on purpose: the formulas (pure functions elsewhere in `trainer.algorithms`), and anything
that loads models or runs collectives other than the batch statistics an advantage needs.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

from trainer.algorithms.ppo import AdaptiveKLController
from trainer.algorithms.rollout_correction import CorrectionInUpdate
from trainer.algorithms.update import Objective
from trainer.config import OnlineStageConfig
from trainer.rollout.experience import Experience


class OnlineAlgorithm(ABC):
    """An online stage's algorithm, built from its config by `registry.online_algorithm`.

    Args:
        config: The stage config; the subclass reads its own section (`config.ppo`, `config.grpo`).
    """

    name: ClassVar[str]
    """The stage that trains it (`ppo`, `grpo`)."""
    needs_critic: ClassVar[bool] = False
    """Whether a value model is loaded, run on each batch and trained."""
    counted_info: ClassVar[tuple[str, ...]] = ()
    """Keys of `Experience.info` its advantages count; the loops sum them over an episode's ranks for
    `episode_metrics`."""

    def __init__(self, config: OnlineStageConfig) -> None:
        self.config = config

    @property
    @abstractmethod
    def needs_reference(self) -> bool:
        """Whether a frozen reference is loaded and run: only with a KL term. Without one nothing reads it."""

    @property
    def ptx_data_path(self) -> str | None:
        """SFT data for a pretraining loss mixed into the actor's update; None: no such loss."""
        return None

    @abstractmethod
    def build_kl_controller(self) -> AdaptiveKLController:
        """The reward's KL coefficient, which `compute_advantages` receives and the loops move each episode."""

    @abstractmethod
    def compute_advantages(self, experience: Experience, kl_coef: float) -> Experience:
        """Rewards and advantages of a batch whose log-probs (and values, with a critic) are filled in.

        Args:
            experience: The batch, with `scores`, `old_logps` (when a reference is used), `ref_logps` and,
                with a critic, `values`.
            kl_coef: The reward's current KL coefficient (`build_kl_controller`).

        Returns:
            A copy with `advantages` (and whatever else the algorithm's objectives read) set.
        """

    @abstractmethod
    def build_actor_objective(self, correction: CorrectionInUpdate | None = None) -> Objective:
        """The policy's objective, with `correction` where the colocated loop takes the rollout correction
        in the update's forward."""

    def build_critic_objective(self) -> Objective | None:
        """The value model's objective; None without a critic."""
        return None

    def episode_metrics(self, info: dict[str, float]) -> dict[str, float]:
        """Metrics of the `counted_info` counts, summed over a batch's parts and ranks."""
        return {}

    def is_exactly_on_policy(self, sample_buffer: bool = False) -> bool:
        """Whether an episode takes exactly one optimizer step, on all of its experience.

        That step runs on the weights that sampled the rollout, so the "old" log-probs equal the
        current ones and need no forward of their own. With several minibatches or epochs, every step
        after the first sees updated weights and needs the old log-probs of the rollout.

        Args:
            sample_buffer: Whether each update step trains on one minibatch sampled from the episode.

        Returns:
            True when the old log-probs may be left out.
        """
        options = self.config.algorithm
        rows_per_rank = options.rollout_batch_size * options.num_collect_steps * self.config.num_generations
        return options.num_update_epochs == 1 and (sample_buffer or rows_per_rank <= options.mini_batch_size)
