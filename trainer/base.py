"""Trainer bases with ColossalChat's API: `SLTrainer` (supervised) and `OLTrainer` (online RL).

Kept from the seed (coati/trainer/base.py): the names, the constructor signatures, the
template methods and the context-managed callbacks. Fixed on purpose:

- `SLTrainer.fit` re-seeds the training sampler every epoch (`set_epoch`), and on resume skips
  exactly the samples already consumed in the resumed epoch only;
- saving is driven by a step interval (`save_interval`), not only by epoch ends;
- `OLTrainer` owns `save_interval` (0 means "never mid-run"; the seed divided by it), copies its
  `callbacks` argument (no shared mutable default), and spells `_setup_update_phase_dataload`
  correctly (the seed's `_setup_update_phrase_dataload` stays as an alias).
"""

from __future__ import annotations

import contextlib
import sys
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from typing import Any

from torch import nn
from torch.optim import Optimizer
from tqdm import tqdm

from trainer.booster import Booster, Plugin
from trainer.callbacks import Callback


class StopTraining(Exception):
    """Raised inside a loop to end `fit` after a checkpoint (max_steps or a requested stop)."""


class SLTrainer(ABC):
    """Base of the supervised trainers (SFT, reward model, DPO).

    Args:
        booster: Applies the parallelism and saves/loads state.
        max_epochs: Number of epochs to train to (epochs `start_epoch .. max_epochs-1` run).
        model: The (boosted) model being trained.
        optimizer: Its optimizer.
        plugin: The booster's plugin (world size, rank, device).
        start_epoch: First epoch to run; set by resume.
    """

    def __init__(self, booster: Booster, max_epochs: int, model: nn.Module, optimizer: Optimizer,
                 plugin: Plugin, start_epoch: int = 0) -> None:
        self.booster = booster
        self.max_epochs = max_epochs
        self.model = model
        self.optimizer = optimizer
        self.plugin = plugin
        self.start_epoch = start_epoch
        # Samples of `start_epoch` that this rank already consumed before a resume.
        self.start_sample_in_epoch = 0
        # The sampler `fit` re-seeds each epoch; subclasses set it in `_before_fit`.
        self.train_sampler = None

    @abstractmethod
    def _before_fit(self, *args: Any, **kwargs: Any) -> None:
        """Build data loaders and anything else the loop needs; set `self.train_sampler`."""

    @abstractmethod
    def _train(self, epoch: int) -> None:
        """Train one epoch."""

    @abstractmethod
    def _eval(self, epoch: int) -> None:
        """Evaluate after an epoch."""

    def _should_stop(self) -> bool:
        """Subclasses return True to end `fit` early (e.g. `max_steps` reached)."""
        return False

    def fit(self, *args: Any, **kwargs: Any) -> None:
        self._before_fit(*args, **kwargs)
        for epoch in range(self.start_epoch, self.max_epochs):
            if self.train_sampler is not None:
                self.train_sampler.set_epoch(epoch)
                if epoch == self.start_epoch:
                    self.train_sampler.skip(self.start_sample_in_epoch)
            self._train(epoch)
            self._eval(epoch)
            if self._should_stop():
                break


class OLTrainer(ABC):
    """Base of the online trainers (PPO, GRPO): collect experience, then learn from it.

    Args:
        actor_booster: Booster of the actor (policy).
        critic_booster: Booster of the critic; None for critic-free methods (GRPO).
        data_buffer: Holds the experiences of the current episode; cleared after each.
        sample_buffer: If True, `_learn` samples single batches from the buffer instead of
            iterating a dataloader over it.
        dataloader_pin_memory: Pin memory in the update-phase dataloader.
        callbacks: Called around fit, episodes, experience making and learning.
    """

    def __init__(self, actor_booster: Booster, critic_booster: Booster | None, data_buffer: Any,
                 sample_buffer: bool, dataloader_pin_memory: bool,
                 callbacks: Sequence[Callback] | None = None) -> None:
        self.actor_booster = actor_booster
        self.critic_booster = critic_booster
        self.data_buffer = data_buffer
        self.sample_buffer = sample_buffer
        self.dataloader_pin_memory = dataloader_pin_memory
        self.callbacks = list(callbacks or [])
        # Save every this many episodes; 0 saves only at the end of fit.
        self.save_interval = 0
        self.num_episodes_done = 0

    # -- callback dispatch ------------------------------------------------------------------------

    def _dispatch(self, hook: str, *args: Any) -> None:
        for callback in self.callbacks:
            getattr(callback, hook)(*args)

    @contextlib.contextmanager
    def _around(self, name: str, *args: Any) -> Iterator[None]:
        self._dispatch(f"on_{name}_start", *args)
        yield
        self._dispatch(f"on_{name}_end", *args)

    def _fit_ctx(self):
        return self._around("fit")

    def _episode_ctx(self, episode: int):
        return self._around("episode", episode)

    def _make_experience_ctx(self):
        return self._around("make_experience")

    def _learn_epoch_ctx(self, epoch: int):
        return self._around("learn_epoch", epoch)

    def _learn_batch_ctx(self):
        return self._around("learn_batch")

    # -- template methods -------------------------------------------------------------------------

    @abstractmethod
    def _make_experience(self, collect_step: int) -> Any:
        """Generate one batch of experience; `fit` appends it to `data_buffer`."""

    @abstractmethod
    def _learn(self, update_step: int) -> None:
        """One update step over the buffered experience."""

    @abstractmethod
    def _setup_update_phase_dataload(self) -> None:
        """Build the dataloader over `data_buffer` for the update phase."""

    def _setup_update_phrase_dataload(self) -> None:
        """Deprecated misspelling kept from the seed API; calls `_setup_update_phase_dataload`."""
        self._setup_update_phase_dataload()

    @abstractmethod
    def _save_checkpoint(self, episode: int) -> None:
        """Save everything needed to resume after `episode`."""

    def _before_fit(self, *args: Any, **kwargs: Any) -> None:
        """Hook for subclasses: set up prompt loaders and the like."""

    def _should_save(self, episode: int) -> bool:
        return self.save_interval > 0 and (episode + 1) % self.save_interval == 0

    def fit(self, num_episodes: int, num_collect_steps: int, num_update_steps: int, *args: Any,
            **kwargs: Any) -> None:
        """Run episodes `num_episodes_done .. num_episodes-1`: collect, then learn, then clear.

        Args:
            num_episodes: Total episodes (resume continues from `num_episodes_done`).
            num_collect_steps: Experience batches collected per episode.
            num_update_steps: Update steps per episode.
            *args: Passed to `_before_fit`.
            **kwargs: Passed to `_before_fit`.
        """
        self._before_fit(*args, **kwargs)
        first_episode = self.num_episodes_done
        show_progress = self.actor_booster.plugin.is_main_process and sys.stderr.isatty()
        with self._fit_ctx():
            for episode in tqdm(range(first_episode, num_episodes), desc="episodes", disable=not show_progress):
                with self._episode_ctx(episode):
                    with self._make_experience_ctx():
                        for collect_step in range(num_collect_steps):
                            self.data_buffer.append(self._make_experience(collect_step))
                    self._setup_update_phase_dataload()
                    for update_step in range(num_update_steps):
                        # Subclasses wrap each minibatch of `_learn` in `self._learn_batch_ctx()`.
                        with self._learn_epoch_ctx(update_step):
                            self._learn(update_step)
                    self.data_buffer.clear()
                self.num_episodes_done = episode + 1
                if self._should_save(episode):
                    self._save_checkpoint(episode)
            if num_episodes > first_episode and not self._should_save(num_episodes - 1):
                self._save_checkpoint(num_episodes - 1)
