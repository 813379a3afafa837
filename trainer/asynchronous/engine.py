"""The experience-driven training API of Trinity-RFT: `Trainer`, `TrainEngineWrapper`, `get_trainer_wrapper`.

`Trainer` is defined here; the interface it drives, `TrainEngineWrapper`, is
`trainer.asynchronous.engine_wrapper`, and `get_trainer_wrapper` (which picks the implementation)
`trainer.asynchronous.wrapper_factory`. Both are importable from here, as Trinity-RFT users expect;
a `Trainer` is handed its wrapper (`engine=`) or builds the config's own.

Seed: `trinity/trainer/trainer.py` (the newer API: `prepare`, `train_step` and `need_sync` are
coroutines; `sync_weight` returns a dict of metrics; `save_checkpoint` is a plain method that
returns one). A `Trainer` takes batches of experience from a buffer that an explorer fills
(`trainer.asynchronous.explorer`), rejects batches that are too stale (`trainer.asynchronous.staleness`),
trains on the rest through a `TrainEngineWrapper`, publishes new weight versions every
`sync_interval` steps, saves checkpoints, and logs every step's metrics. The native engine,
`trainer.asynchronous.verl.verl_trainer.TorchTrainEngine`, is the seed's verl layer on plain PyTorch.

Publishing weights is one act with three channels, chosen as the seed's `sync_method` chooses:
an in-process `Synchronizer` given to the `Trainer` (the seed's "memory": `upload_state_dict`),
else the weights directory (the seed's "checkpoint": `save_state_dict`). The seed's third,
`sync_weight` over a collective group ("nccl"), has no counterpart here (no separate inference engine).

Deliberate differences from the seed, and why:

- `prepare` publishes the trainer's current weights: the explorer waits for a published version
  rather than loading the model path itself, so a resumed run's explorer continues from the
  trainer's weights, not the initial ones;
- an error in a step ends `train` with that error: the seed logs it, breaks out and saves, which
  turns a failed run into a "finished" one;
- batches older than `asynchronous.max_staleness` weight versions are dropped and counted
  (`staleness/rejected`); the seed's default sample strategy takes whatever the buffer holds;
- experience is trained on exactly once across restarts: the buffer position (the last batch
  consumed) is part of every checkpoint, a resumed trainer reads the batch after it, and batches
  are deleted only once a durable checkpoint covers them (`trainer.asynchronous.buffer`);
- an explorer that marks the buffer failed, or a wait past `asynchronous.wait_timeout`, ends the
  run with that error after a blocking checkpoint of the steps trained so far; SIGTERM/SIGINT
  (`trainer.lifecycle.preemption`) end it at the next step boundary (or while waiting for experience) with a
  blocking checkpoint, no export, and the preemption exit status.

Metrics logged each step: the engine's (`TorchTrainEngine` lists them), `time/train_step`,
`time/sync_weight`, `time/trainer_sync_interval`, `time/save_checkpoint`, `staleness/rejected`
and `buffer/position` (the number of the buffer batch the step trained on). The metrics file has
one line per step: a save's time, and batches rejected after a step, join that step's line.
"""

from __future__ import annotations

import asyncio
import logging
import time

from trainer.asynchronous.buffer import ExperienceBuffer, ExplorerError, FileBuffer, buffer_dir
from trainer.asynchronous.engine_wrapper import TrainEngineWrapper
from trainer.asynchronous.staleness import is_too_stale
from trainer.asynchronous.synchronizer import Synchronizer
from trainer.asynchronous.wrapper_factory import get_trainer_wrapper
from trainer.config import OnlineStageConfig
from trainer.errors import AlignflowError, WaitTimeout
from trainer.lifecycle import preemption
from trainer.rollout.experience import Experience
from trainer.tracking.tracker import NullTracker, Tracker

logger = logging.getLogger(__name__)


class Trainer:
    """Consumes experience, trains, syncs weights and saves (Trinity-RFT's `Trainer` API).

    Args:
        config: A PPO or GRPO config; its `asynchronous` section sets buffer, weights, intervals,
            staleness limits and timeouts.
        buffer: Where experience comes from; default the file buffer in `asynchronous.buffer_dir`
            (a `QueueBuffer` serves an explorer thread in the same process).
        synchronizer: Publish weights to this in-process synchronizer instead of the weights
            directory (for an explorer thread in the same process).
        engine: The training backend; default `get_trainer_wrapper(config, synchronizer)`.
    """

    def __init__(self, config: OnlineStageConfig, buffer: ExperienceBuffer | None = None,
                 synchronizer: Synchronizer | None = None, engine: TrainEngineWrapper | None = None) -> None:
        self.config = config
        self.options = config.asynchronous
        self.engine = engine if engine is not None else get_trainer_wrapper(config, synchronizer)
        self.buffer = buffer if buffer is not None else FileBuffer(buffer_dir(config))
        self.sync_method = "memory" if synchronizer is not None else "checkpoint"
        self.sync_interval = self.options.sync_interval
        self.save_interval = self.options.save_interval
        self.total_steps = self.options.total_steps
        self.max_staleness = self.options.staleness_limit
        self.last_sync_step: int | None = None
        self.last_sync_time: float | None = None
        self.monitor: Tracker = NullTracker()
        self._alive = False
        self._discarded = 0

    @property
    def num_rejected(self) -> int:
        return self.engine.num_rejected

    @property
    def train_step_num(self) -> int:
        return self.engine.train_step_num

    async def prepare(self) -> None:
        await self.engine.prepare()
        self.monitor = self.engine.tracker
        # The engine prepared on a worker thread, where signal handlers cannot be installed.
        preemption.install(self.config.checkpoint.preemption_grace_seconds)
        if not self.engine.buffer_position and not self.config.checkpoint.resume and isinstance(self.buffer, FileBuffer):
            self.buffer.reset()  # starting over: no batch of an earlier run belongs to this one
        self.buffer.seek(self.engine.buffer_position)
        if self.engine.buffer_position:
            logger.info("trainer continues after buffer batch %d", self.engine.buffer_position)
        self._alive = True
        await self.sync_weight()  # the explorer starts from the trainer's current weights

    async def need_sync(self) -> bool:
        step = self.train_step_num
        return self.last_sync_step != step and step % self.sync_interval == 0

    def need_save(self) -> bool:
        return self.save_interval > 0 and self.train_step_num % self.save_interval == 0

    async def sync_weight(self) -> dict[str, float]:
        """Publish the current policy as version `train_step_num`; returns timing metrics."""
        metrics: dict[str, float] = {}
        if self.last_sync_time is not None:
            metrics["time/trainer_sync_interval"] = time.monotonic() - self.last_sync_time
        started = time.monotonic()
        publish = self.engine.upload_state_dict if self.sync_method == "memory" else self.engine.save_state_dict
        await asyncio.to_thread(publish)
        metrics["time/sync_weight"] = time.monotonic() - started
        self.last_sync_step, self.last_sync_time = self.train_step_num, time.monotonic()
        return metrics

    def save_checkpoint(self, block_until_saved: bool = False, save_as_hf: bool = False) -> dict[str, float]:
        """Save a checkpoint of the current step; returns timing metrics."""
        started = time.monotonic()
        logger.info("saving checkpoint at trainer step %d", self.train_step_num)
        self.engine.save_checkpoint(block_until_saved=block_until_saved, save_as_hf=save_as_hf)
        return {"time/save_checkpoint": time.monotonic() - started}

    async def train_step(self, exps: list[Experience]) -> dict[str, float]:
        started = time.monotonic()
        metrics = await self.engine.train_step(exps)
        return metrics | {"time/train_step": time.monotonic() - started}

    async def _next_batch(self, metrics: dict[str, float]) -> Experience | None:
        """The next batch from the buffer, syncing weights while waiting so an explorer waiting for them can go on.

        None once the buffer is closed and drained, or when a signal asks the run to stop.
        """
        deadline = time.monotonic() + self.options.wait_timeout
        while True:
            try:
                batch = await asyncio.to_thread(self.buffer.get, min(1.0, self.options.wait_timeout))
                self.engine.buffer_position = self.buffer.position
                return batch
            except WaitTimeout:
                if preemption.stop_requested():
                    return None
                if await self.need_sync():
                    metrics.update(await self.sync_weight())
                if time.monotonic() > deadline:
                    raise WaitTimeout(f"{getattr(self.buffer, 'directory', 'buffer')}: no experience for "
                                      f"{self.options.wait_timeout:g} s at trainer step {self.train_step_num}; "
                                      "is the explorer running?") from None

    async def _sample_data(self, metrics: dict[str, float]) -> list[Experience] | None:
        """The next batch young enough to learn from, or None once the explorer closed the buffer (or a signal came).

        Batches more than `max_staleness` weight versions old are dropped, counted and logged.
        """
        while (batch := await self._next_batch(metrics)) is not None:
            if not is_too_stale(batch, self.train_step_num, self.max_staleness):
                metrics["staleness/rejected"] = float(self.num_rejected)
                return [batch]
            self.engine.num_rejected += 1
            logger.warning("rejected a batch of weight version %d at trainer version %d: older than "
                           "asynchronous.max_staleness %d (%d rejected so far)", batch.version, self.train_step_num,
                           self.max_staleness, self.num_rejected)
            self.monitor.log_metrics({"staleness/rejected": float(self.num_rejected)}, self.train_step_num)
        return None

    async def train(self) -> str:
        """Train until `total_steps` or until the explorer closes the buffer; end with a blocking save and export.

        Returns:
            "finished", or "preempted" when SIGTERM/SIGINT stopped the run (saved, not exported).

        Raises:
            ExplorerError: The explorer marked the buffer failed (after a blocking save).
            WaitTimeout: No experience within `asynchronous.wait_timeout` (after a blocking save).
        """
        try:
            while self.train_step_num < self.total_steps and not preemption.stop_requested():
                if not await self._run_step():
                    break
        except (ExplorerError, WaitTimeout) as err:
            logger.error("%s; saving trainer step %d before stopping", err, self.train_step_num)
            self._save_before_stopping()
            raise
        if preemption.stopped_by_signal():
            self._save_before_stopping()
            logger.warning("stopped at trainer step %d (signal %s) with a checkpoint; rerun to resume",
                           self.train_step_num, preemption.signal_received())
            return "preempted"
        self.save_checkpoint(block_until_saved=True, save_as_hf=True)
        self.buffer.discard_through(self.engine.buffer_position)  # a finished run needs none of its batches
        return "finished"

    async def _run_step(self) -> bool:
        """Sample, train, sync, save and log one step; False when no batch came (closed buffer, signal)."""
        metrics: dict[str, float] = {}
        exps = await self._sample_data(metrics)
        if exps is None:
            if not preemption.stopped_by_signal():
                logger.info("the explorer closed the buffer after %d steps", self.train_step_num)
            return False
        metrics.update(await self.train_step(exps))
        metrics["buffer/position"] = float(self.buffer.position)
        if await self.need_sync():
            metrics.update(await self.sync_weight())
        self.monitor.log_metrics(metrics, self.train_step_num)  # before saving: a checkpoint carries the history
        if self.need_save():
            self.monitor.log_metrics(self.save_checkpoint(), self.train_step_num)
        self._discard_covered()
        logger.info("trainer step %d: score %.3f, loss %.4f, staleness %.0f, buffer batch %d", self.train_step_num,
                    metrics.get("critic/score/mean", float("nan")), metrics.get("loss", float("nan")),
                    metrics.get("staleness/max", float("nan")), self.buffer.position)
        return True

    def _save_before_stopping(self) -> None:
        """A blocking checkpoint of the step reached (no export), then garbage-collect what it covers."""
        if self.train_step_num == 0:
            return  # nothing trained: a rerun starts where this one did
        try:
            self.save_checkpoint(block_until_saved=True)
        except AlignflowError as err:  # the reason for stopping is the error to report; this one is logged
            logger.error("the checkpoint before stopping failed: %s", err)
            return
        self._discard_covered()

    def _discard_covered(self) -> None:
        """Delete the buffer batches that durable checkpoints cover (never one a resume could still need)."""
        position = self.engine.discardable_buffer_position()
        if position > self._discarded:
            self.buffer.discard_through(position)
            self._discarded = position

    async def shutdown(self) -> None:
        """Wait for background saves, close the tracker and restore the signal handlers (also after a failed `prepare`)."""
        try:
            await asyncio.to_thread(self.engine.close)
        finally:
            preemption.uninstall()
            self._alive = False

    async def is_alive(self) -> bool:
        return self._alive
