"""`SupervisedTrainer`: the SLTrainer loop shared by SFT, reward modelling and DPO.

The stages differ only in their model, data and `Objective`; this loop batches, accumulates,
steps (through `algorithms.update.train_step`), logs, evaluates and saves for all of them.

Faults it handles: a step with a non-finite loss or gradient norm is skipped and counted
(`train/nonfinite_skipped`), and more than `train.max_nonfinite_steps` in a row end the run with a
`TrainingError`, as does a run that ends inside such a streak (its model is not exported); SIGTERM
or SIGINT (`trainer.lifecycle.preemption`) ends the run after the current step with a blocking checkpoint.
An epoch's checkpoint is written after its evaluation, so the metric history it carries is whole.
"""

from __future__ import annotations

import contextlib
import logging
import math
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from tqdm import tqdm

from trainer.algorithms.update import NonFiniteGuard, Objective, evaluate, train_step
from trainer.base import SLTrainer, StopTraining
from trainer.checkpointing.checkpoint import CheckpointManager, TrainerState
from trainer.config import StageConfig, TrainConfig
from trainer.data.collate import example_length
from trainer.data.sampler import ResumableSampler
from trainer.errors import CheckpointError
from trainer.lifecycle import preemption
from trainer.parallel.booster import Booster, Plugin
from trainer.runtime import all_reduce_sum
from trainer.tracking.tracker import Tracker

logger = logging.getLogger(__name__)


def total_steps(train: TrainConfig, num_samples: int, world_size: int) -> int:
    """Optimizer steps of a run: `train.max_steps`, or every epoch's steps."""
    return train.max_steps or train.max_epochs * steps_per_epoch(
        num_samples, world_size, train.micro_batch_size, train.gradient_accumulation_steps)


def steps_per_epoch(num_samples: int, world_size: int, micro_batch_size: int, accumulation: int) -> int:
    micro_batches = math.ceil((num_samples // world_size) / micro_batch_size)
    return math.ceil(micro_batches / accumulation)


def count_tokens(batch: dict[str, torch.Tensor]) -> int:
    """Real (non-pad) tokens of a batch: the count packing records, else the attention mask's ones."""
    if "num_tokens" in batch:
        return int(batch["num_tokens"])
    mask = batch.get("attention_mask")
    return int(mask.sum()) if mask is not None else batch["input_ids"].numel()


class SupervisedTrainer(SLTrainer):
    """Trains one model on a fixed dataset with a given objective.

    Args:
        booster, max_epochs, model, optimizer, plugin, start_epoch: As in `SLTrainer`.
        scheduler: Learning-rate scheduler stepped once per optimizer step.
        objective: Forward + loss of one micro-batch.
        config: The stage config (loop sizes, intervals).
        train_examples, eval_examples: Encoded examples; `eval_examples` may be None.
        collate: Turns a list of examples into a batch of tensors.
        checkpoints: Saves and restores the run.
        tracker: Receives params and metrics (a no-op on ranks other than 0).
        stop_after_steps: End after this global step, with a checkpoint, as a preemption would.
    """

    def __init__(self, booster: Booster, max_epochs: int, model: nn.Module, optimizer: torch.optim.Optimizer,
                 plugin: Plugin, start_epoch: int = 0, *, scheduler: Any, objective: Objective,
                 config: StageConfig, train_examples: list[dict], eval_examples: list[dict] | None,
                 collate: Callable[[list[dict]], dict], checkpoints: CheckpointManager, tracker: Tracker,
                 stop_after_steps: int | None = None) -> None:
        super().__init__(booster, max_epochs, model, optimizer, plugin, start_epoch)
        self.scheduler = scheduler
        self.objective = objective
        self.config = config
        self.train_examples = train_examples
        self.eval_examples = eval_examples
        self.collate = collate
        self.checkpoints = checkpoints
        self.tracker = tracker
        self.stop_after_steps = stop_after_steps
        self.global_step = 0
        self.last_saved_step = -1
        self.last_metrics: dict[str, float] = {}
        self.eval_metrics: dict[str, float] = {}
        self.nonfinite = NonFiniteGuard(config.train.max_nonfinite_steps)
        self.epoch_finished = False

    # -- setup ------------------------------------------------------------------------------------

    def _loader(self, examples: list[dict], sampler: ResumableSampler) -> torch.utils.data.DataLoader:
        return torch.utils.data.DataLoader(examples, batch_size=self.config.train.micro_batch_size,
                                           sampler=sampler, collate_fn=self.collate)

    def _before_fit(self) -> None:
        world, rank = self.plugin.world_size, self.plugin.rank
        train = self.config.train
        lengths = [example_length(example) for example in self.train_examples] if train.group_by_length else None
        self.train_sampler = ResumableSampler(len(self.train_examples), world, rank, shuffle=True, seed=train.seed,
                                              lengths=lengths, batch_size=train.micro_batch_size)
        self.train_loader = self._loader(self.train_examples, self.train_sampler)
        self.eval_loader = None
        if self.eval_examples:
            self.eval_loader = self._loader(self.eval_examples, ResumableSampler(len(self.eval_examples), world, rank,
                                                                                 shuffle=False))
        self.max_steps = total_steps(self.config.train, len(self.train_examples), world)
        is_tty = sys.stderr.isatty()
        self.progress = tqdm(total=self.max_steps, initial=self.global_step, desc="train", unit="step",
                             disable=not (self.plugin.is_main_process and is_tty), dynamic_ncols=True)

    def components(self) -> dict:
        """What a checkpoint of this trainer holds besides the loop state."""
        return {"model": (self.model, self.optimizer, self.scheduler)}

    def restore(self, state: TrainerState) -> None:
        """Continue from a checkpoint's loop position (model and optimizer are already loaded)."""
        self.start_epoch = state.epoch
        self.global_step = state.global_step
        self.last_saved_step = state.global_step
        self.start_sample_in_epoch = state.samples_in_epoch // self.plugin.world_size
        self.nonfinite.restore(state.num_nonfinite_skipped, state.nonfinite_in_a_row)

    # -- loop -------------------------------------------------------------------------------------

    def _accumulation_groups(self):
        """Yield lists of `gradient_accumulation_steps` micro-batches (the last may be shorter)."""
        group = []
        for batch in self.train_loader:
            group.append(batch)
            if len(group) == self.config.train.gradient_accumulation_steps:
                yield group
                group = []
        if group:
            yield group

    def _train(self, epoch: int) -> None:
        self.model.train()
        self.epoch_finished = False
        samples_seen = self.start_sample_in_epoch if epoch == self.start_epoch else 0
        for group in self._accumulation_groups():
            if self.global_step >= self.max_steps:
                return  # reached mid-epoch; that step was saved
            started = time.perf_counter()
            metrics = train_step(self.booster, self.model, self.optimizer, self.scheduler, group, self.objective,
                                 self.config.optimizer.max_grad_norm)
            samples_seen += sum(batch["num_samples"] for batch in group)
            self.global_step += 1
            self.nonfinite.observe(metrics, self.global_step)  # a TrainingError after too many in a row
            # Where the run is (the TrainJob's progress: trainer.tracking.trainjob_status).
            metrics.update({"progress/epoch": float(epoch + 1), "progress/total_epochs": float(
                self.config.train.max_epochs), "progress/total_steps": float(self.max_steps)})
            self._record(metrics, group, time.perf_counter() - started)
            state = self._state(epoch, samples_seen)
            is_preempted = preemption.stop_requested()  # every rank, every step: they stop at the same one
            is_stopping = is_preempted or (self.stop_after_steps is not None
                                           and self.global_step >= self.stop_after_steps)
            if self._should_save_now() or is_stopping:
                # Mid-run saves upload in the background; the last one (and a stop) blocks.
                self._save(state, block=is_stopping or self.global_step >= self.max_steps)
            if is_stopping:
                reason = f"signal {preemption.signal_received()}" if is_preempted else "--stop-after-steps"
                raise StopTraining(f"stopped after step {self.global_step} ({reason}); checkpoint "
                                   f"{self.checkpoints.last_durable or 'written'}; rerun to resume")
        self.epoch_finished = True

    def _state(self, epoch: int, samples_seen: int) -> TrainerState:
        return TrainerState(epoch=epoch, global_step=self.global_step,
                            samples_in_epoch=samples_seen * self.plugin.world_size, world_size=self.plugin.world_size,
                            num_nonfinite_skipped=self.nonfinite.total, nonfinite_in_a_row=self.nonfinite.in_a_row)

    def _should_save_now(self) -> bool:
        interval = self.config.checkpoint.save_interval
        return (interval > 0 and self.global_step % interval == 0) or self.global_step == self.max_steps

    def _save(self, state: TrainerState, block: bool) -> None:
        if self.last_saved_step == state.global_step:
            return  # an epoch end that coincides with an interval save: resuming either way is the same
        self.checkpoints.save(self.components(), state, state.global_step, block=block)
        self.last_saved_step = state.global_step

    def _record(self, metrics: dict[str, float], group: list[dict], seconds: float) -> None:
        local = torch.tensor([sum(count_tokens(b) for b in group),
                              sum(b["num_samples"] for b in group)], dtype=torch.float64)
        tokens, samples = all_reduce_sum(local).tolist()
        metrics.update({"perf/tokens_per_second": tokens / seconds, "perf/samples_per_second": samples / seconds,
                        "perf/step_time": seconds, "train/nonfinite_skipped": float(self.nonfinite.total)})
        self.last_metrics = metrics
        self.progress.update(1)
        self.progress.set_postfix(loss=f"{metrics['loss']:.4f}", tok_s=f"{tokens / seconds:.0f}")
        if self.global_step % self.config.train.log_interval == 0 or self.global_step == self.max_steps:
            self.tracker.log_metrics(metrics, self.global_step)
            logger.info("step %d/%d loss %.4f lr %.2e %.0f tok/s", self.global_step, self.max_steps,
                        metrics["loss"], metrics["lr"], metrics["perf/tokens_per_second"])

    def _eval(self, epoch: int) -> None:
        """Evaluate after an epoch, then checkpoint the finished epoch (in the background)."""
        if self.eval_loader is not None:
            metrics = evaluate(self.booster, self.model, self.eval_loader, self.objective)
            self.eval_metrics = {f"eval/{k}": v for k, v in metrics.items()}
            self.tracker.log_metrics(self.eval_metrics, self.global_step)
            logger.info("epoch %d eval: %s", epoch, ", ".join(f"{k}={v:.4f}" for k, v in self.eval_metrics.items()))
        if self.epoch_finished:
            self._save(self._state(epoch + 1, 0), block=False)

    def _should_stop(self) -> bool:
        return self.global_step >= self.max_steps

    def fit(self) -> None:
        try:
            super().fit()
        except BaseException:
            with contextlib.suppress(CheckpointError):
                self.checkpoints.wait()  # let a background save finish; the error in flight is the one to report
            raise
        finally:
            if getattr(self, "progress", None) is not None:  # absent when `_before_fit` failed
                self.progress.close()
        self.checkpoints.wait()  # the final checkpoint is complete (or its failure raised) before fit returns
        self.nonfinite.check_end(self.global_step)
