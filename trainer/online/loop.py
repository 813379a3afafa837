"""`PPOTrainer` and `GRPOTrainer`: the online stages on ColossalChat's `OLTrainer` loop.

An episode collects `num_collect_steps` batches of rollouts from the prompt stream, annotates
them (old and reference log-probs; PPO: values, KL-shaped rewards and GAE; GRPO: group-normalised
advantages), then takes `num_update_epochs` passes over the episode's experience in minibatches.
Every optimizer step goes through `algorithms.update.train_step` with the algorithm's objective;
`NonFiniteGuard` counts the steps it skips for a non-finite loss or gradient norm
(`train/nonfinite_skipped`, `critic/nonfinite_skipped`) and fails the run after
`train.max_nonfinite_steps` in a row.

What PPO and GRPO do differently is asked of the stage's algorithm object (`self.algorithm`, from
`trainer.algorithms.online.registry.online_algorithm`): its advantages, objectives, KL coefficient
and episode metrics. One GRPO step reads loop -> rollout (the stage's `Rollout`, `trainer.rollout`)
-> algorithm (`trainer.algorithms.online.grpo`) -> update (`trainer.algorithms.update.train_step`).

Work that cannot change the result is left out: no reference model without a KL term
(`OnlineAlgorithm.needs_reference`), and no "old" log-prob forward when the episode's only optimizer
step runs on the weights that sampled it (`OnlineAlgorithm.is_exactly_on_policy`; the objective then
takes the current log-probs as constants, `ppo.old_or_current_logps`, and the rollout correction of an
engine's log-probs takes the trainer's from the update's own forward,
`rollout_correction.CorrectionInUpdate`). Responses are sampled and scored by the stage's `Rollout`
(`trainer.rollout.builder.build_rollout`) through the configured engine.

The asynchronous engine (`trainer.asynchronous.verl`) asks the same algorithm objects, and shares the
batching in `trainer.online.batches`, so each exists once.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from trainer.algorithms.online.base import OnlineAlgorithm
from trainer.algorithms.online.ppo import critic_metric_names
from trainer.algorithms.online.registry import online_algorithm
from trainer.algorithms.ppo import response_logps, response_values
from trainer.algorithms.rollout_correction import CorrectionInUpdate
from trainer.algorithms.update import NonFiniteGuard, train_step
from trainer.base import OLTrainer, StopTraining
from trainer.checkpointing.checkpoint import CheckpointManager, ModelParts
from trainer.config import OnlineStageConfig
from trainer.lifecycle import preemption
from trainer.online.batches import micro_batches
from trainer.online.correction import METRIC_PREFIX, correct_rollout
from trainer.online.prompts import PromptStream, num_extra_groups
from trainer.parallel.booster import Booster
from trainer.rewards.weighted import reward_metrics
from trainer.rollout.experience import Experience, ReplayBuffer, concat_experiences
from trainer.rollout.interface import SAMPLES_KEPT, Rollout
from trainer.runtime import all_reduce_sum
from trainer.tracking.timing import PhaseTimer
from trainer.tracking.tracker import Tracker

logger = logging.getLogger(__name__)


class PPOTrainer(OLTrainer):
    """PPO with an actor, a critic, a frozen reference and a reward source.

    Args:
        actor_booster, critic_booster, data_buffer, sample_buffer, dataloader_pin_memory, callbacks:
            As in `OLTrainer`.
        actor: (model, optimizer, scheduler) of the policy.
        critic: (model, optimizer, scheduler) of the value model; None for GRPO.
        ref_model: Frozen reference policy; None when the stage has no KL term
            (`OnlineAlgorithm.needs_reference`).
        rollout: Samples and scores the responses (`trainer.rollout.builder.build_rollout`, on the actor; multi-turn
            episodes when `config.environment` is set); `config.rollout` is taken from it, its engine chosen.
        tokenizer: Pads the episode's experience.
        config: The stage config.
        prompts: Prompt rows (`prompt`, optional `answer`).
        checkpoints: Saves actor, critic and the loop position.
        tracker: Receives metrics (no-op off rank 0).
        ptx_batches: Optional SFT batches for the pretraining loss, cycled through.
        stop_after_episodes: Save and stop after this episode count (a simulated preemption).

    With `sample_buffer` set, `fit` skips `_setup_update_phase_dataload` and each update step trains
    on one minibatch sampled (without replacement within the step) from the episode's experience.
    """

    def __init__(self, actor_booster: Booster, critic_booster: Booster | None, data_buffer: ReplayBuffer,
                 sample_buffer: bool = False, dataloader_pin_memory: bool = True, callbacks: list | None = None, *,
                 actor: ModelParts, critic: ModelParts | None, ref_model: nn.Module | None, rollout: Rollout,
                 tokenizer: Any, config: OnlineStageConfig, prompts: list[dict], checkpoints: CheckpointManager,
                 tracker: Tracker, ptx_batches: list[dict] | None = None,
                 stop_after_episodes: int | None = None) -> None:
        super().__init__(actor_booster, critic_booster, data_buffer, sample_buffer, dataloader_pin_memory, callbacks)
        if config.rollout.engine == "auto":  # the rollout's choice, before anything reads it (the correction's default)
            tracker.log_params({"rollout.chosen_engine": rollout.settings.engine})
        config = config.model_copy(update={"rollout": rollout.settings})
        self.rollout = rollout
        self.actor, self.actor_optimizer, self.actor_scheduler = actor
        self.critic, self.critic_optimizer, self.critic_scheduler = critic or (None, None, None)
        self.ref_model = ref_model
        self.tokenizer = tokenizer
        self.config = config
        self.algorithm = online_algorithm(config)  # what PPO and GRPO do differently
        self.options = config.algorithm
        self.save_interval = config.checkpoint.save_interval
        self.checkpoints = checkpoints
        self.tracker = tracker
        self.ptx_batches = ptx_batches or []
        self.stop_after_episodes = stop_after_episodes
        plugin = actor_booster.plugin
        self.device = plugin.device
        self.prompts = PromptStream(prompts, plugin.world_size, plugin.rank, config.train.seed)
        self.global_step = 0
        self.kl_controller = self.algorithm.build_kl_controller()
        self.nonfinite = NonFiniteGuard(config.train.max_nonfinite_steps)
        self.critic_nonfinite = NonFiniteGuard(config.train.max_nonfinite_steps)
        self.last_metrics: dict[str, float] = {}
        self.samples: list[dict] = []  # a few (prompt, response, score) of the latest rollout, for reports
        self._experience: Experience | None = None  # the episode's experience, once concatenated
        self.timer = PhaseTimer()  # where each episode's time goes (`perf/time/*`)
        # The rollout correction, taken in the update's forward when that is exactly on-policy (None: never).
        correction = config.rollout.correction
        self.correction_in_update = CorrectionInUpdate(correction.mode, correction.clip_max, correction.clip_min) \
            if config.rollout.is_correcting else None
        self._episode_sizes = (0.0, 0.0)  # the episode's response tokens and responses, all ranks

    # -- collect ------------------------------------------------------------------------------------

    def collect(self, rows: list[dict]) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """Generate responses for `rows` (`num_generations` per prompt) and score them; with
        `environment.oversample_groups`, only the groups of all but that many prompts: the first to complete."""
        group_size = self.config.num_generations
        extra = num_extra_groups(self.config)
        rows = [row for row in rows for _ in range(group_size)]
        if extra:
            scored = self.rollout.collect(rows, self.timer, group_size=group_size,
                                          num_groups=len(rows) // group_size - extra)
        else:
            scored = self.rollout.collect(rows, self.timer)
        self.samples = scored.samples(SAMPLES_KEPT)
        if scored.metrics:  # multi-turn episodes: `agent/*` of this rank's rollout
            self.tracker.log_metrics(scored.metrics, self.global_step)
        self.tracker.log_metrics(reward_metrics(self.rollout.scorer), self.global_step)  # rewards/<source>/mean, /std
        if self.config.rollout.is_correcting and scored.engine_logps is not None:  # the engine's own log-probs
            return {**scored.batch, "behaviour_logps": scored.engine_logps}, scored.scores
        return scored.batch, scored.scores

    @torch.no_grad()
    def _make_experience(self, collect_step: int) -> Experience:
        if collect_step == 0:
            self._experience = None  # a new episode
            with self.timer.phase("sync_weights"):
                self.rollout.sync_weights(self.actor)  # the last episode's updates (a no-op when it samples with it)
        # A fixed count, whichever groups complete, so the checkpointed prompt position does not depend on timing.
        batch, scores = self.collect(self.prompts.take(self.options.rollout_batch_size + num_extra_groups(self.config)))
        return self.annotate(batch, scores)

    @torch.no_grad()
    def annotate(self, batch: dict[str, torch.Tensor], scores: torch.Tensor, version: int = 0) -> Experience:
        """Add log-probs, values (PPO), rewards and advantages to freshly generated sequences.

        Old log-probs are left out when the update is exactly on-policy and no reference needs them
        (for the KL-shaped rewards and `episode/kl_to_ref`); reference log-probs without a reference. The
        rollout correction of the engine's log-probs is then taken in the update (`CorrectionInUpdate`), so it
        needs no old log-probs either.
        """
        mask = batch["action_mask"].float()
        values = old_logps = ref_logps = None
        if self.critic is not None:
            with self.timer.phase("values"):
                values = response_values(self.critic, batch) * mask
        has_reference = self.ref_model is not None
        correcting = self.config.rollout.is_correcting
        on_policy = self.algorithm.is_exactly_on_policy(self.sample_buffer)
        in_update = (self.correction_in_update is not None and on_policy and not has_reference
                     and "behaviour_logps" in batch)
        if has_reference or (correcting and not in_update) or not on_policy:
            with self.timer.phase("logps_old"):
                old_logps = response_logps(self.actor, batch) * mask
        if correcting and "behaviour_logps" not in batch:  # the hf engine sampled with these very weights
            batch = {**batch, "behaviour_logps": old_logps}
        if has_reference:
            with self.timer.phase("logps_ref"):
                ref_logps = response_logps(self.ref_model, batch) * mask
        experience = Experience(**batch, scores=scores, old_logps=old_logps, ref_logps=ref_logps, values=values,
                                version=version)
        if correcting and not in_update:
            experience, correction_metrics = correct_rollout(experience, self.config.rollout.correction)
            self.tracker.log_metrics(correction_metrics, self.global_step)
        return self.algorithm.compute_advantages(experience, self.kl_controller.value)

    # -- learn --------------------------------------------------------------------------------------

    def _setup_update_phase_dataload(self) -> None:
        self._episode_experience()

    def _episode_experience(self) -> Experience:
        """The episode's experience as one batch (logged once per episode), and its shuffling generator."""
        if self._experience is None:
            self._experience = concat_experiences(self.data_buffer.items, self.tokenizer.pad_token_id)
            self._log_episode(self._experience)
            self._generator = torch.Generator().manual_seed(self.config.train.seed + self.num_episodes_done)
        return self._experience

    def _minibatches(self) -> list[Experience]:
        experience = self._episode_experience()
        order = torch.randperm(len(experience), generator=self._generator)
        minibatches = experience.select(order).split(self.options.mini_batch_size)
        return minibatches[:1] if self.sample_buffer else minibatches  # sampling: one random minibatch per step

    def _learn(self, update_step: int) -> None:
        for minibatch in self._minibatches():
            self._on_learn_batch_start()
            self.last_metrics = self.learn_minibatch(minibatch)
            self._on_learn_batch_end(minibatch)
            self.global_step += 1
            if self.global_step % self.config.train.log_interval == 0:
                self.tracker.log_metrics(self.last_metrics, self.global_step)

    def learn_minibatch(self, minibatch: Experience) -> dict[str, float]:
        """One optimizer step of the actor (and critic) on a minibatch; returns its metrics."""
        ptx = self.ptx_batches[self.global_step % len(self.ptx_batches)] if self.ptx_batches else None
        batches = micro_batches(minibatch, self.config.train.micro_batch_size, self.device, ptx,
                                self.dataloader_pin_memory)
        with self.timer.phase("update"):
            return self._update(batches, self.global_step + 1)

    def _update(self, batches: list[dict], step: int) -> dict[str, float]:
        metrics = train_step(self.actor_booster, self.actor, self.actor_optimizer, self.actor_scheduler, batches,
                             self.algorithm.build_actor_objective(self.correction_in_update),
                             self.config.optimizer.max_grad_norm)
        if self.correction_in_update is not None:  # rank 0's rows, as `correct_rollout` logs them
            statistics = self.correction_in_update.statistics()
            if statistics:
                self.tracker.log_metrics({METRIC_PREFIX + name: value for name, value in statistics.items()}, step)
        self.nonfinite.observe(metrics, step)  # a TrainingError after too many in a row
        metrics["train/nonfinite_skipped"] = float(self.nonfinite.total)
        if self.critic is not None:
            critic_metrics = train_step(self.critic_booster, self.critic, self.critic_optimizer, self.critic_scheduler,
                                        batches, self.algorithm.build_critic_objective(),
                                        self.config.optimizer.max_grad_norm)
            self.critic_nonfinite.observe({**critic_metrics, "loss": critic_metrics.get("value_loss")}, step)
            critic_metrics["nonfinite_skipped"] = float(self.critic_nonfinite.total)
            metrics.update(critic_metric_names(critic_metrics))
        return metrics

    def check_finite_end(self) -> None:
        """TrainingError if the run ends inside a streak of skipped steps: that model is not exported."""
        self.nonfinite.check_end(self.global_step)
        self.critic_nonfinite.check_end(self.global_step)

    def _log_episode(self, experience: Experience) -> None:
        mask = experience.action_mask.float()
        has_kl = experience.ref_logps is not None  # no reference: no KL to report (nor to adapt kl_coef to)
        kl_to_ref = ((experience.old_logps - experience.ref_logps) * mask).sum(-1) if has_kl \
            else torch.zeros(len(experience), device=mask.device)  # (B,) k1 per sequence
        counted = self.algorithm.counted_info  # e.g. GRPO's dropped groups and penalties
        counts = [experience.info.get(key, 0.0) for key in counted]
        local = torch.tensor([experience.scores.float().sum().item(), mask.sum().item(), kl_to_ref.sum().item(),
                              float(len(experience)), *counts], dtype=torch.float64, device=mask.device)
        score, tokens, kl, count, *counts = all_reduce_sum(local).tolist()
        self._episode_sizes = (tokens, count)
        metrics = {"episode/reward_mean": score / count, "episode/response_length": tokens / count,
                   "episode/kl_coef": self.kl_controller.value,
                   # Where the run is (the TrainJob's progress: trainer.tracking.trainjob_status).
                   "progress/episode": float(self.num_episodes_done + 1),
                   "progress/total_episodes": float(self.options.num_episodes)}
        metrics.update(self.algorithm.episode_metrics(dict(zip(counted, counts))))
        if has_kl:
            metrics["episode/kl_to_ref"] = kl / count
            self.kl_controller.update(kl / count, int(count))
        self.tracker.log_metrics(metrics, self.global_step)
        logger.info("episode %d: reward %.3f, length %.1f%s", self.num_episodes_done, metrics["episode/reward_mean"],
                    metrics["episode/response_length"], f", kl {kl / count:.4f}" if has_kl else "")

    @contextmanager
    def _episode_ctx(self, episode: int) -> Iterator[None]:
        """The episode's hooks (`OLTrainer`), timed: its `perf/` breakdown is logged when it ends."""
        self.timer.reset()
        self._episode_sizes = (0.0, 0.0)
        with super()._episode_ctx(episode):
            yield
        tokens, completions = self._episode_sizes
        self.tracker.log_metrics(self.timer.metrics(tokens=tokens, completions=completions), self.global_step)

    # -- checkpoints --------------------------------------------------------------------------------

    def components(self) -> dict[str, ModelParts]:
        parts = {"actor": (self.actor, self.actor_optimizer, self.actor_scheduler)}
        if self.critic is not None:
            parts["critic"] = (self.critic, self.critic_optimizer, self.critic_scheduler)
        return parts

    def _should_save(self, episodes_done: int) -> bool:
        if preemption.stop_requested():  # SIGTERM/SIGINT on any rank: save now (blocking) and stop
            self.stop_after_episodes = episodes_done
        return super()._should_save(episodes_done) or episodes_done == self.stop_after_episodes

    def _save_checkpoint(self, episode: int) -> None:
        """Save after `episode` episodes (the seed passes `episode + 1`: the count done, 1-based)."""
        state = {"episode": episode, "global_step": self.global_step, "kl_coef": self.kl_controller.value,
                 **self.prompts.position(), **self._nonfinite_state()}
        is_last = episode >= self.options.num_episodes or episode == self.stop_after_episodes
        self.checkpoints.save(self.components(), state, episode, block=is_last)
        if self.stop_after_episodes is not None and episode >= self.stop_after_episodes:
            raise StopTraining(f"stopped after episode {episode} as requested")

    def restore(self, state: dict[str, Any]) -> None:
        self.num_episodes_done = state["episode"]
        self.global_step = state["global_step"]
        self.kl_controller.value = state["kl_coef"]
        self.prompts.restore(state["prompt_epoch"], state["prompt_samples"])
        for prefix, guard in (("", self.nonfinite), ("critic_", self.critic_nonfinite)):  # absent before issue 12
            guard.restore(state.get(f"{prefix}num_nonfinite_skipped", 0), state.get(f"{prefix}nonfinite_in_a_row", 0))

    def _nonfinite_state(self) -> dict[str, int]:
        return {"num_nonfinite_skipped": self.nonfinite.total, "nonfinite_in_a_row": self.nonfinite.in_a_row,
                "critic_num_nonfinite_skipped": self.critic_nonfinite.total,
                "critic_nonfinite_in_a_row": self.critic_nonfinite.in_a_row}

    # -- evaluation ---------------------------------------------------------------------------------

    def evaluate(self, rows: list[dict]) -> float:
        """Mean score of greedy responses to `rows`, split across ranks."""
        from trainer.online.evaluate import mean_score

        plugin = self.actor_booster.plugin
        self.rollout.sync_weights(self.actor)  # an engine with its own weights has not seen the last updates
        greedy = self.rollout.with_generation(self.config.generation.model_copy(update={"temperature": 0.0}))
        means, _ = mean_score(greedy, rows, rank=plugin.rank, world_size=plugin.world_size)
        return means[0]


class GRPOTrainer(PPOTrainer):
    """GRPO: `num_generations` responses per prompt, group-normalised advantages, no critic.

    Everything GRPO-specific is its algorithm object's (`trainer.algorithms.online.grpo.GRPOAlgorithm`),
    which the loop builds from the config; this name is ColossalChat's.
    """


TRAINERS: dict[str, type[PPOTrainer]] = {"ppo": PPOTrainer, "grpo": GRPOTrainer}
"""The `OLTrainer` each algorithm is known by, keyed by `OnlineAlgorithm.name`; the loop is the same."""


def trainer_class(algorithm: OnlineAlgorithm) -> type[PPOTrainer]:
    return TRAINERS[algorithm.name]
