"""Trainer bases with ColossalChat's API: `SLTrainer` (supervised) and `OLTrainer` (online RL).

Kept from the seed (`applications/ColossalChat/coati/trainer/base.py`): the names, the
constructor signatures, the template methods and their call order, and the seed's semantics of
`OLTrainer.fit`: the make-experience hooks fire around every collect step and
`on_make_experience_end` receives that step's experience; `sample_buffer=True` skips the
update-phase dataloader (`_learn` then samples from `data_buffer` itself); `_save_checkpoint`
receives `episode + 1`, the number of episodes done; the fit and episode hooks run in `finally`,
so `on_episode_end` and `on_fit_end` fire when an episode raises; `on_learn_batch_end` receives
the batch learnt from. A subclass may implement the update-phase setup under the seed's
misspelled name `_setup_update_phrase_dataload` or under `_setup_update_phase_dataload`.

Deliberate differences from the seed, and why:

- `SLTrainer.fit` re-seeds the training sampler every epoch (`set_epoch`), and on resume skips
  exactly the samples already consumed in the resumed epoch only (the seed restarts the epoch);
- `OLTrainer` owns `save_interval` (default 0, "only at the end"): the seed's `fit` reads an
  attribute only its subclasses set, and divides by it;
- `OLTrainer.fit` resumes at `num_episodes_done` and saves once more after the last episode when
  the interval did not just save it (the seed starts at episode 0 and can end unsaved);
- `callbacks` is copied (the seed shares one mutable default list between instances).
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

from trainer.callbacks import Callback
from trainer.parallel.booster import Booster, Plugin


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
        data_buffer: Holds the experiences of the current episode (`append`, `clear`); cleared
            after each episode (on-policy).
        sample_buffer: If True, `fit` does not set up an update-phase dataloader and `_learn`
            samples its batch from `data_buffer` itself (the seed's semantics).
        dataloader_pin_memory: Pin the memory of update-phase batches held on the CPU before they
            are copied to a CUDA device (subclasses apply it where they move batches; it does
            nothing on CPU-only runs).
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

    def __new__(cls, *args: Any, **kwargs: Any) -> OLTrainer:
        # The update-phase setup is abstract under either spelling; implementing one is enough.
        base = OLTrainer
        if (cls._setup_update_phase_dataload is base._setup_update_phase_dataload
                and cls._setup_update_phrase_dataload is base._setup_update_phrase_dataload):
            raise TypeError(f"Can't instantiate abstract class {cls.__name__} without an implementation of "
                            "_setup_update_phase_dataload (or the seed's spelling _setup_update_phrase_dataload)")
        return super().__new__(cls)

    # -- callback dispatch ------------------------------------------------------------------------

    def _dispatch(self, hook: str, *args: Any) -> None:
        for callback in self.callbacks:
            getattr(callback, hook)(*args)

    @contextlib.contextmanager
    def _fit_ctx(self) -> Iterator[None]:
        self._dispatch("on_fit_start")
        try:
            yield
        finally:
            self._dispatch("on_fit_end")

    @contextlib.contextmanager
    def _episode_ctx(self, episode: int) -> Iterator[None]:
        self._dispatch("on_episode_start", episode)
        try:
            yield
        finally:
            self._dispatch("on_episode_end", episode)

    def _on_make_experience_start(self) -> None:
        self._dispatch("on_make_experience_start")

    def _on_make_experience_end(self, experience: Any) -> None:
        self._dispatch("on_make_experience_end", experience)

    def _on_learn_epoch_start(self, epoch: int) -> None:
        self._dispatch("on_learn_epoch_start", epoch)

    def _on_learn_epoch_end(self, epoch: int) -> None:
        self._dispatch("on_learn_epoch_end", epoch)

    def _on_learn_batch_start(self) -> None:
        """Subclasses call this before each batch `_learn` trains on."""
        self._dispatch("on_learn_batch_start")

    def _on_learn_batch_end(self, experience: Any) -> None:
        """Subclasses call this after each batch `_learn` trained on, with that batch."""
        self._dispatch("on_learn_batch_end", experience)

    # -- template methods -------------------------------------------------------------------------

    @abstractmethod
    def _make_experience(self, collect_step: int) -> Any:
        """Generate one batch of experience; `fit` appends it to `data_buffer`."""

    @abstractmethod
    def _learn(self, update_step: int) -> None:
        """One update step: a pass over the update-phase dataloader, or one batch sampled from
        `data_buffer` when `sample_buffer` is set."""

    def _setup_update_phase_dataload(self) -> None:
        """Build the dataloader over `data_buffer` for the update phase (implement this or the seed's spelling)."""
        if not self._overrides("_setup_update_phrase_dataload"):
            raise_missing_update_setup(type(self))
        self._setup_update_phrase_dataload()

    def _setup_update_phrase_dataload(self) -> None:
        """The seed's (misspelled) name of `_setup_update_phase_dataload`; `fit` calls this one, as the seed does."""
        if not self._overrides("_setup_update_phase_dataload"):
            raise_missing_update_setup(type(self))
        self._setup_update_phase_dataload()

    def _overrides(self, name: str) -> bool:
        """Whether this object's class implements `name` itself, rather than inheriting `OLTrainer`'s alias.

        Each alias calls the other only when the other is implemented: two base aliases calling each
        other would recurse until the stack runs out (reached through `super()`, or on an object
        made without `__new__`'s check).
        """
        return getattr(type(self), name) is not getattr(OLTrainer, name)

    @abstractmethod
    def _save_checkpoint(self, episode: int) -> None:
        """Save everything needed to resume; `episode` is the number of episodes done (the seed's `episode + 1`)."""

    def _before_fit(self, *args: Any, **kwargs: Any) -> None:
        """Hook for subclasses: set up prompt loaders and the like."""

    def _should_save(self, episodes_done: int) -> bool:
        return self.save_interval > 0 and episodes_done % self.save_interval == 0

    def _collect_phase(self, collect_step: int) -> None:
        self._on_make_experience_start()
        experience = self._make_experience(collect_step)
        self._on_make_experience_end(experience)
        self.data_buffer.append(experience)

    def _update_phase(self, update_step: int) -> None:
        self._on_learn_epoch_start(update_step)
        self._learn(update_step)
        self._on_learn_epoch_end(update_step)

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
                    for collect_step in range(num_collect_steps):
                        self._collect_phase(collect_step)
                    if not self.sample_buffer:
                        self._setup_update_phrase_dataload()
                    for update_step in range(num_update_steps):
                        self._update_phase(update_step)
                    self.data_buffer.clear()  # on-policy: an episode learns from its own experience only
                self.num_episodes_done = episode + 1
                if self._should_save(episode + 1):
                    self._save_checkpoint(episode + 1)
            if num_episodes > first_episode and not self._should_save(num_episodes):
                self._save_checkpoint(num_episodes)


def raise_missing_update_setup(cls: type) -> None:
    """The one error for an online trainer that implements neither name of the update-phase setup."""
    raise NotImplementedError(f"{cls.__name__} implements neither _setup_update_phase_dataload nor the seed's "
                              "spelling _setup_update_phrase_dataload; implement one of them")
