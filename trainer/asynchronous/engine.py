"""The experience-driven training API of Trinity-RFT: `TrainEngineWrapper` and `Trainer`.

A `Trainer` consumes batches of experience from a buffer that an explorer (another process, see
`trainer.asynchronous.explorer`) fills, trains on each through a `TrainEngineWrapper`, publishes new weight
versions for the explorer every `sync_interval` steps, and saves checkpoints. The native engine,
`TorchTrainEngine`, reuses the colocated PPO/GRPO trainer (`trainer.online.loop`): the same annotation
and the same `train_step`, so no loss exists twice.

The asynchronous path runs the trainer as one process (the explorer is separate); data-parallel
trainer ranks are not supported here yet.
"""

from __future__ import annotations

import asyncio
import logging
import time
from abc import ABC, abstractmethod
from typing import Any

from trainer.asynchronous.buffer import ExperienceBuffer, FileBuffer, buffer_dir
from trainer.asynchronous.weights import publish_weights, weights_dir
from trainer.config import GRPOConfig, OnlineStageConfig, PPOConfig, StageConfig
from trainer.errors import ConfigError, WaitTimeout
from trainer.online.experience import Experience, concat_experiences

logger = logging.getLogger(__name__)


class TrainEngineWrapper(ABC):
    """What the `Trainer` needs from a training backend."""

    @abstractmethod
    def prepare(self) -> None:
        """Load models, optimizers and the latest checkpoint."""

    @property
    @abstractmethod
    def train_step_num(self) -> int:
        """Optimizer-step batches trained so far (restored on resume)."""

    @abstractmethod
    def train_step(self, batch_exps: list[Experience]) -> dict[str, float]:
        """Train on a batch of experiences; return metrics."""

    @abstractmethod
    def save_checkpoint(self, block_until_saved: bool = False, save_as_hf: bool = False) -> None:
        """Save a resumable checkpoint (in the background unless `block_until_saved`); `save_as_hf` also exports."""

    @abstractmethod
    def sync_weight(self) -> None:
        """Make the current policy available to explorers."""

    @abstractmethod
    def upload_state_dict(self) -> dict[str, Any]:
        """The policy's full state dict, for an explorer in the same process."""

    @abstractmethod
    def save_state_dict(self) -> None:
        """Publish the policy as a numbered version in the weights directory."""


class TorchTrainEngine(TrainEngineWrapper):
    """Native PyTorch engine over the colocated PPO/GRPO trainer's models and update step."""

    def __init__(self, config: OnlineStageConfig) -> None:
        self.config = config
        self.options = config.algorithm
        self._step = 0

    def prepare(self) -> None:
        from trainer.context import build_context
        from trainer.online.stages import build_online_trainer

        self.context = build_context(self.config)
        if self.context.env.is_distributed:
            raise ConfigError("the experience-driven Trainer runs as one process; use mode 'colocated' for torchrun")
        self.trainer = build_online_trainer(self.config, self.context)
        latest = self.trainer.checkpoints.latest() if self.config.checkpoint.resume else None
        if latest is not None:
            self._step = self.trainer.checkpoints.load(latest, self.trainer.components())["train_step"]

    @property
    def train_step_num(self) -> int:
        return self._step

    def train_step(self, batch_exps: list[Experience]) -> dict[str, float]:
        raw = concat_experiences(batch_exps, self.context.tokenizer.pad_token_id).to(self.trainer.device)
        # Old log-probs are recomputed with the current policy, as in the colocated path.
        sequences = {k: getattr(raw, k) for k in ("input_ids", "attention_mask", "action_mask", "position_ids")}
        experience = self.trainer.annotate(sequences, raw.scores, version=raw.version)
        metrics: dict[str, float] = {}
        for _ in range(self.options.num_update_epochs):
            for minibatch in experience.split(self.options.mini_batch_size):
                metrics = self.trainer.learn_minibatch(minibatch)
                self.trainer.global_step += 1
        self._step += 1
        metrics.update({"reward_mean": float(raw.scores.mean()), "staleness": float(self._step - 1 - raw.version)})
        self.trainer.tracker.log_metrics(metrics, self._step)
        return metrics

    def save_checkpoint(self, block_until_saved: bool = False, save_as_hf: bool = False) -> None:
        state = {"train_step": self._step, "episode": 0, "global_step": self.trainer.global_step,
                 "kl_coef": self.trainer.kl_controller.value, **self.trainer.prompts.position()}
        # Non-blocking: tensors are copied, then written (uploaded) by a background thread.
        self.trainer.checkpoints.save(self.trainer.components(), state, self._step, block=block_until_saved)
        if save_as_hf:
            from trainer.context import finish_stage

            trainer = self.trainer
            exports = {"model": trainer.actor} | ({"critic": trainer.critic} if trainer.critic is not None else {})
            finish_stage(self.context, exports, {"train_step": self._step, **trainer.last_metrics}, self._step,
                         samples=trainer.samples)

    def wait_for_save(self) -> None:
        self.trainer.checkpoints.wait()

    def sync_weight(self) -> None:
        self.save_state_dict()

    def upload_state_dict(self) -> dict[str, Any]:
        return self.context.booster.full_state_dict(self.trainer.actor)

    def save_state_dict(self) -> None:
        publish_weights(weights_dir(self.config), self.upload_state_dict(), self._step)
        logger.info("published weight version %d", self._step)

    def close(self) -> None:
        self.wait_for_save()
        self.context.tracker.close()


def get_trainer_wrapper(config: StageConfig) -> TrainEngineWrapper:
    """The engine for a config: the native torch engine for PPO and GRPO."""
    if isinstance(config, (PPOConfig, GRPOConfig)):
        return TorchTrainEngine(config)
    raise ConfigError(f"no experience-driven engine for {type(config).__name__}; it supports ppo and grpo")


class Trainer:
    """Consumes experience, trains, syncs weights and saves (Trinity-RFT's `Trainer` API).

    Args:
        config: A PPO or GRPO config; its `asynchronous` section sets buffer, weights, intervals
            and timeouts.
        buffer: Where experience comes from; default the file buffer in `asynchronous.buffer_dir`
            (a `QueueBuffer` serves an explorer thread in the same process).
    """

    def __init__(self, config: OnlineStageConfig, buffer: ExperienceBuffer | None = None) -> None:
        self.config = config
        self.options = config.asynchronous
        self.engine = get_trainer_wrapper(config)
        self.buffer = buffer if buffer is not None else FileBuffer(buffer_dir(config))
        self._alive = False
        self._synced_step = -1

    async def prepare(self) -> None:
        await asyncio.to_thread(self.engine.prepare)
        self._alive = True
        if self._synced_step < self.train_step_num:
            await self.sync_weight()  # the explorer starts from the trainer's current weights

    @property
    def train_step_num(self) -> int:
        return self.engine.train_step_num

    def need_sync(self) -> bool:
        step = self.train_step_num
        return step > self._synced_step and step % self.options.sync_interval == 0

    def need_save(self) -> bool:
        interval = self.options.save_interval
        return interval > 0 and self.train_step_num > 0 and self.train_step_num % interval == 0

    async def train_step(self, exps: list[Experience]) -> dict[str, float]:
        return await asyncio.to_thread(self.engine.train_step, exps)

    async def sync_weight(self) -> None:
        await asyncio.to_thread(self.engine.sync_weight)
        self._synced_step = self.train_step_num

    async def save_checkpoint(self, block_until_saved: bool = False, save_as_hf: bool = False) -> None:
        await asyncio.to_thread(self.engine.save_checkpoint, block_until_saved, save_as_hf)

    async def _next_batch(self) -> Experience | None:
        """The next batch, syncing weights while waiting so a producer waiting for them can go on."""
        deadline = time.monotonic() + self.options.wait_timeout
        while True:
            try:
                return await asyncio.to_thread(self.buffer.get, min(1.0, self.options.wait_timeout))
            except WaitTimeout:
                if self.need_sync():
                    await self.sync_weight()
                if time.monotonic() > deadline:
                    raise WaitTimeout(f"{getattr(self.buffer, 'directory', 'buffer')}: no experience for {self.options.wait_timeout:g} s "
                                        f"at trainer step {self.train_step_num}; is the explorer running?") from None

    async def train(self) -> str:
        """Train until `total_steps` or until the explorer closes the buffer; end with a blocking save."""
        while self.train_step_num < self.options.total_steps:
            batch = await self._next_batch()
            if batch is None:
                logger.info("the explorer closed the buffer after %d steps", self.train_step_num)
                break
            metrics = await self.train_step([batch])
            logger.info("trainer step %d: reward %.3f, loss %.4f", self.train_step_num, metrics["reward_mean"],
                        metrics.get("loss", float("nan")))
            if self.need_sync():
                await self.sync_weight()
            if self.need_save():
                await self.save_checkpoint()
        await self.save_checkpoint(block_until_saved=True, save_as_hf=True)
        return "finished"

    async def shutdown(self) -> None:
        if self._alive:
            await asyncio.to_thread(self.engine.close)
        self._alive = False

    async def is_alive(self) -> bool:
        return self._alive
