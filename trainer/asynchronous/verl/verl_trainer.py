"""`TorchTrainEngine`: the native PyTorch `TrainEngineWrapper`, composed of the seed's workers.

Seed: `VerlPPOTrainerWrapper` in `trinity/trainer/verl/verl_trainer.py`. `prepare` builds an
`ActorRolloutRefWorker`, a `CriticWorker` when the algorithm needs one (PPO), sets the algorithm
and resumes from the latest checkpoint. What PPO and GRPO do differently is asked of the stage's
algorithm object (`trainer.algorithms.online.registry.online_algorithm`), as in the colocated loop. One `train_step` runs, in the seed's order (its "decoupled" mode: `old_logps` are
recomputed as the proximal policy):

1. `to_data_proto`: the step's experiences as one batch, with each row's weight version;
2. `compute_log_prob` (`old_logps`), `compute_ref_log_prob` (`ref_logps`), PPO: `compute_values`;
3. the importance correction of stale rows (`trainer.asynchronous.staleness`);
4. rewards and advantages with the algorithm's `compute_advantages`, as the colocated loop does;
5. PPO: `update_critic`; then `update_actor` (both through `trainer.algorithms.update.train_step`);
6. metrics, and the adaptive KL coefficient moves as in the colocated loop.

Metrics of a step: the actor's and critic's (`trainer.asynchronous.verl.dp_actor`), the batch's
(`compute_data_metrics`; for GRPO also `episode/dropped_groups`, `episode/truncated_fraction` and
`episode/overlong_penalty`, the algorithm's `episode_metrics`), `staleness/*`
(`trainer.asynchronous.staleness`), `kl/to_ref` (mean k1 KL to the reference per sequence) and
`kl/coef` (the reward's KL coefficient, PPO).

A checkpoint holds, besides both roles' models and optimizers, the loop state the `Trainer` needs
for exactly-once experience: `buffer_position` (the last buffer batch consumed) and the count of
rejected batches, and each role's non-finite skip counters. `discardable_buffer_position` says up
to which batch the buffer may be garbage-collected: the position of the newest durable checkpoint
but one, so a resume that falls back past a damaged latest checkpoint still finds its batches.
A policy with a non-finite weight is neither published to explorers nor exported.

The trainer runs as one process (data-parallel trainer ranks are not supported here yet); the
explorer is another process or a thread.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import torch

from trainer.algorithms.online.registry import online_algorithm
from trainer.algorithms.update import NonFiniteGuard
from trainer.asynchronous.engine_wrapper import TrainEngineWrapper
from trainer.asynchronous.staleness import importance_correction, staleness_metrics
from trainer.asynchronous.synchronizer import Synchronizer
from trainer.asynchronous.verl.data_proto import DataProto, compute_data_metrics, to_data_proto
from trainer.asynchronous.verl.fsdp_checkpoint_manager import CheckpointMonitor
from trainer.asynchronous.verl.fsdp_workers import ActorRolloutRefWorker, CriticWorker
from trainer.asynchronous.weights import weights_dir
from trainer.checkpointing.checkpoint import CheckpointManager
from trainer.config import OnlineStageConfig
from trainer.errors import CheckpointError, ConfigError
from trainer.lifecycle.context import (
    build_context,
    close_context,
    finish_stage,
    open_outputs,
    resume_latest,
    seed_everything,
)
from trainer.rollout.experience import Experience
from trainer.rollout.interface import SAMPLES_KEPT
from trainer.tracking.timing import PhaseTimer
from trainer.tracking.tracker import Tracker

logger = logging.getLogger(__name__)


def optimizer_steps_per_run(config: OnlineStageConfig) -> int:
    """Optimizer steps of a whole asynchronous run: the span of the learning-rate schedule."""
    options = config.algorithm
    rows = options.rollout_batch_size * config.num_generations  # one explorer batch per trainer step
    return config.asynchronous.total_steps * options.num_update_epochs * -(-rows // options.mini_batch_size)


class TorchTrainEngine(TrainEngineWrapper):
    """Native PyTorch engine: actor, reference and (PPO) critic workers in this process.

    Args:
        config: A PPO or GRPO config.
        synchronizer: The in-process weight channel, when the explorer is a thread of this process.
    """

    def __init__(self, config: OnlineStageConfig, synchronizer: Synchronizer | None = None) -> None:
        self.config = config
        self.algorithm = online_algorithm(config)  # what PPO and GRPO do differently
        self.synchronizer = synchronizer
        self.global_steps = 0  # the seed's name: trainer steps done (= the policy's weight version)
        self.last_metrics: dict[str, float] = {}
        self.samples: list[dict] = []
        self._saved_step: int | None = None
        self.buffer_position = 0
        self.num_rejected = 0
        self._saved_positions: dict[int, int] = {}  # checkpoint step -> the buffer position it records
        self._durable_positions: list[int] = []  # buffer positions of durable checkpoints, oldest first

    # -- setup ---------------------------------------------------------------------------------------

    async def prepare(self) -> None:
        await asyncio.to_thread(self._prepare)

    def _prepare(self) -> None:
        config = self.config
        self.context = context = build_context(config)
        if context.env.is_distributed:
            raise ConfigError("the experience-driven Trainer runs as one process; use mode 'colocated' for torchrun")
        self.checkpoints = CheckpointManager(context.checkpoint_root(), context.booster, config.checkpoint.keep_last)
        use_critic = self.algorithm.needs_critic
        monitor = CheckpointMonitor(self.checkpoints, {"actor", "critic"} if use_critic else {"actor"})
        total = optimizer_steps_per_run(config)
        seed_everything(config.train.seed)
        # "wg" (worker group) is the seed's name; here each group is one worker.
        self.actor_rollout_wg = ActorRolloutRefWorker(config, context, monitor, total, weights_dir(config),
                                                      self.synchronizer)
        self.actor_rollout_wg.init_model()
        self.critic_wg = CriticWorker(config, context, monitor, total) if use_critic else None
        if self.critic_wg is not None:
            self.critic_wg.init_model()
        open_outputs(context)
        seed_everything(config.train.seed + context.env.rank)
        self.actor_rollout_wg.setup_weight_sync_group()
        self.actor_rollout_wg.set_algorithm(config)
        self.actor_rollout_wg.actor.nonfinite = NonFiniteGuard(config.train.max_nonfinite_steps)
        if self.critic_wg is not None:
            self.critic_wg.critic.nonfinite = NonFiniteGuard(config.train.max_nonfinite_steps)
        self.kl_controller = self.algorithm.build_kl_controller()
        self._load_checkpoint()

    def _load_checkpoint(self) -> None:
        """Resume both roles from the run's latest checkpoint, through the path every stage uses."""
        components = {"actor": self.actor_rollout_wg.checkpoint_manager.parts}
        if self.critic_wg is not None:
            components["critic"] = self.critic_wg.checkpoint_manager.parts
        resume_latest(self.context, self.checkpoints, components, self._restore)

    def _restore(self, state: dict[str, Any]) -> None:
        if "train_step" not in state:
            raise CheckpointError(f"{self.checkpoints.root}: the latest checkpoint was written by the colocated loop "
                                  f"(episode {state.get('episode')}); the asynchronous trainer cannot continue it: use "
                                  "another output_dir or checkpoint.resume false")
        self.global_steps = self._saved_step = state["train_step"]
        self.actor_rollout_wg.actor.num_optimizer_steps = state["optimizer_steps"]
        self.kl_controller.value = state["kl_coef"]
        # Checkpoints from before positions were recorded consumed one batch per step, deleting it on read.
        self.buffer_position = state.get("buffer_position", state["train_step"])
        self.num_rejected = state.get("num_rejected", 0)
        self._durable_positions = [self.buffer_position]
        for role, guard in self._guards().items():
            guard.restore(state.get(f"{role}num_nonfinite_skipped", 0), state.get(f"{role}nonfinite_in_a_row", 0))

    def _guards(self) -> dict[str, NonFiniteGuard]:
        """Each role's non-finite guard, keyed by its prefix in the checkpoint state ("" for the actor)."""
        guards = {"": self.actor_rollout_wg.actor.nonfinite}
        if self.critic_wg is not None:
            guards["critic_"] = self.critic_wg.critic.nonfinite
        return guards

    @property
    def train_step_num(self) -> int:
        return self.global_steps

    @property
    def tracker(self) -> Tracker:
        return self.context.tracker

    # -- one step ------------------------------------------------------------------------------------

    async def train_step(self, batch_exps: list[Experience]) -> dict[str, float]:
        return await asyncio.to_thread(self._train_step, batch_exps)

    def _train_step(self, batch_exps: list[Experience]) -> dict[str, float]:
        config = self.config
        timer = PhaseTimer()  # the explorer samples and scores: its log line gives those times
        data = to_data_proto(batch_exps, self.context.tokenizer.pad_token_id)
        metrics = staleness_metrics(self.global_steps, data.meta_info["model_versions"])
        with timer.phase("logps_old"):
            data = data.union(self.actor_rollout_wg.compute_log_prob(data))
        with timer.phase("logps_ref"):
            data = data.union(self.actor_rollout_wg.compute_ref_log_prob(data))
        if self.critic_wg is not None:
            with timer.phase("values"):
                data = data.union(self.critic_wg.compute_values(data))
        weights, weight_metrics = importance_correction(data.batch, config.asynchronous.importance_sampling_cap)
        data = data.union(weights)
        data = DataProto(self.algorithm.compute_advantages(data.batch, self.kl_controller.value), data.meta_info)
        self.global_steps += 1
        seed = config.train.seed + self.global_steps  # actor and critic see the minibatches in the same order
        with timer.phase("update"):
            if self.critic_wg is not None:
                metrics |= self.critic_wg.update_critic(data, torch.Generator().manual_seed(seed))
            metrics |= self.actor_rollout_wg.update_actor(data, torch.Generator().manual_seed(seed))
        metrics |= weight_metrics | compute_data_metrics(data, config.generation.max_new_tokens)
        metrics |= self.algorithm.episode_metrics(data.batch.info)  # GRPO: dynamic sampling, truncation, overlong
        metrics |= self._update_kl_coef(data.batch)
        metrics |= agent_metrics(batch_exps)
        mask = data.batch.action_mask
        metrics |= timer.metrics(tokens=float(mask.sum()), completions=float(len(mask)))
        self.last_metrics = metrics
        self.samples = decode_samples(self.context.tokenizer, data.batch, SAMPLES_KEPT)
        return metrics

    def _update_kl_coef(self, batch: Experience) -> dict[str, float]:
        """Move the reward's KL coefficient towards `ppo.target_kl`, as the colocated loop does per episode."""
        kl_to_ref = ((batch.old_logps - batch.ref_logps) * batch.action_mask).sum(-1).mean().item()  # k1 per sequence
        metrics = {"kl/to_ref": kl_to_ref, "kl/coef": self.kl_controller.value}
        self.kl_controller.update(kl_to_ref, len(batch))
        return metrics

    # -- saving and publishing -----------------------------------------------------------------------

    def save_checkpoint(self, block_until_saved: bool = False, save_as_hf: bool = False) -> None:
        step = self.global_steps
        if save_as_hf:
            for guard in self._guards().values():
                guard.check_end(step)  # a run that ends inside a streak of skipped steps is not exported
        if self._saved_step != step:
            # `global_step` is the step metrics are logged at (here the trainer step), as in every stage.
            state = {"train_step": step, "global_step": step, "kl_coef": self.kl_controller.value,
                     "optimizer_steps": self.actor_rollout_wg.actor.num_optimizer_steps,
                     "buffer_position": self.buffer_position, "num_rejected": self.num_rejected}
            for role, guard in self._guards().items():
                state |= {f"{role}num_nonfinite_skipped": guard.total, f"{role}nonfinite_in_a_row": guard.in_a_row}
            self._saved_positions[step] = self.buffer_position
            if self.critic_wg is not None:
                self.critic_wg.save_checkpoint(step, block=block_until_saved)
            self.actor_rollout_wg.save_checkpoint(step, state, block=block_until_saved)
            self._saved_step = step
        if block_until_saved:
            self.actor_rollout_wg.wait_on_save_thread()
            if self.critic_wg is not None:
                self.critic_wg.wait_on_save_thread()
        if save_as_hf:
            exports = {"model": self.actor_rollout_wg.module}
            if self.critic_wg is not None:
                exports["critic"] = self.critic_wg.module
            finish_stage(self.context, exports, {"train_step": step, **self.last_metrics}, step, samples=self.samples)

    def discardable_buffer_position(self) -> int:
        """Buffer batches up to this position may be deleted: the newest durable checkpoint but one covers them."""
        durable = self.checkpoints.last_durable  # set by the writer thread once a checkpoint is complete
        if durable is not None:
            step = int(durable.rstrip("/").rsplit("step-", 1)[-1])
            if step in self._saved_positions:
                self._durable_positions.append(self._saved_positions[step])
            for saved in [s for s in self._saved_positions if s <= step]:
                # Older saves not seen durable (failed, or superseded unseen) never count: deleting less is safe.
                del self._saved_positions[saved]
        return self._durable_positions[-2] if len(self._durable_positions) >= 2 else 0

    def sync_weight(self) -> None:
        self.actor_rollout_wg.sync_weight()

    def upload_state_dict(self) -> None:
        self.actor_rollout_wg.upload_state_dict(self.global_steps)
        logger.info("uploaded weight version %d to the in-process synchronizer", self.global_steps)

    def save_state_dict(self) -> None:
        self.actor_rollout_wg.save_state_dict(self.global_steps)
        logger.info("published weight version %d", self.global_steps)

    def close(self) -> None:
        """Wait for a background checkpoint write, then end tracking and release the run's lease
        (`trainer.lifecycle.context.close_context`), whatever `prepare` got to."""
        try:
            if hasattr(self, "actor_rollout_wg"):
                self.actor_rollout_wg.wait_on_save_thread()
        finally:
            if hasattr(self, "context"):
                close_context(self.context)


def decode_samples(tokenizer: Any, batch: Experience, count: int) -> list[dict]:
    """The first `count` (prompt, response, score) triples of a batch, for reports."""
    samples = []
    for ids, attention, action, score in zip(batch.input_ids[:count], batch.attention_mask, batch.action_mask,
                                             batch.scores.tolist()):
        prompt = ids[attention.bool() & ~action.bool()].tolist()
        samples.append({"prompt": tokenizer.decode(prompt, skip_special_tokens=True),
                        "response": tokenizer.decode(ids[action.bool()].tolist(), skip_special_tokens=True),
                        "score": score})
    return samples


def agent_metrics(batches: list[Experience]) -> dict[str, float]:
    """The mean over `batches` of the `agent/*` the explorer measured on each one's episodes (none for one-turn rows)."""
    keys = sorted({key for batch in batches for key in batch.info if key.startswith("agent/")})
    return {key: sum(batch.info.get(key, 0.0) for batch in batches) / len(batches) for key in keys}
