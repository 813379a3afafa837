"""`PPOTrainer` and `GRPOTrainer`: the online stages on ColossalChat's `OLTrainer` loop.

An episode collects `num_collect_steps` batches of rollouts from the prompt stream, annotates
them (old and reference log-probs; PPO: values, KL-shaped rewards and GAE; GRPO: group-normalised
advantages), then takes `num_update_epochs` passes over the episode's experience in minibatches.
Every optimizer step goes through `algorithms.update.train_step` with the algorithm's objective;
`NonFiniteGuard` counts the steps it skips for a non-finite loss or gradient norm
(`train/nonfinite_skipped`, `critic/nonfinite_skipped`) and fails the run after
`train.max_nonfinite_steps` in a row.

Work that cannot change the result is left out: no reference model without a KL term
(`needs_reference`), and no "old" log-prob forward when the episode's only optimizer step runs on
the weights that sampled it (`is_exactly_on_policy`; the objective then takes the current log-probs
as constants, `ppo.old_or_current_logps`). Responses are sampled through the configured
`RolloutEngine` (`trainer.online.engines`).

The pieces the asynchronous engine (`trainer.asynchronous`) shares with this loop are module
functions here, so each exists once: `compute_advantages`, `build_actor_objective`,
`build_critic_objective`, `critic_metric_names`, `build_kl_controller`, `needs_reference` and
`micro_batches`.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from trainer.algorithms.advantages import (
    group_advantages,
    informative_rows,
    moment_sums,
    moments,
    normalise,
    overlong_penalty,
    reinforce_returns,
    rloo_advantages,
    sequence_kl_penalty,
)
from trainer.algorithms.grpo import GRPOObjective
from trainer.algorithms.ppo import (
    AdaptiveKLController,
    PPOActorObjective,
    PPOCriticObjective,
    gae_advantages,
    kl_estimate,
    response_logps,
    response_values,
    shape_rewards,
    whiten,
)
from trainer.algorithms.update import NonFiniteGuard, train_step
from trainer.base import OLTrainer, StopTraining
from trainer.checkpointing.checkpoint import CheckpointManager, ModelParts
from trainer.config import GRPOConfig, OnlineStageConfig
from trainer.lifecycle import preemption
from trainer.online.correction import correct_rollout
from trainer.online.engines import RolloutEngine, build_rollout_engine, engine_setup
from trainer.online.experience import Experience, ReplayBuffer, concat_experiences
from trainer.online.prompts import PromptStream
from trainer.online.rollout import generate_and_score
from trainer.parallel.booster import Booster
from trainer.rewards.weighted import reward_metrics
from trainer.runtime import all_reduce_sum
from trainer.tracking.tracker import Tracker

logger = logging.getLogger(__name__)
SAMPLES_KEPT = 5
GRPO_COUNTS = ("rows", "dropped_groups", "truncated", "overlong_penalty")  # what `grpo_advantages` counts in `info`


# -- shared with the asynchronous engine ----------------------------------------------------------


def compute_advantages(experience: Experience, config: OnlineStageConfig, kl_coef: float) -> Experience:
    """Rewards and advantages of a batch whose log-probs (and, for PPO, values) are filled in.

    PPO: per-token KL-shaped rewards from `old_logps` and `ref_logps`, GAE, optional whitening.
    GRPO: `grpo_advantages`. Returns a copy with `rewards`/`returns` (PPO) and `advantages` set.
    """
    if isinstance(config, GRPOConfig):
        return grpo_advantages(experience, config)
    mask = experience.action_mask.float()  # (B, T)
    options = config.ppo
    if experience.ref_logps is None:  # no reference (kl_coef 0, `needs_reference`): no KL penalty to shape
        kl = torch.zeros_like(mask)
    else:
        kl = kl_estimate(experience.old_logps, experience.ref_logps, options.kl_estimator) * mask
    rewards = shape_rewards(experience.scores, kl, mask, kl_coef=kl_coef, reward_clip=options.reward_clip)
    advantages, returns = gae_advantages(rewards, experience.values, mask, gamma=options.gamma, lam=options.lam)
    if options.whiten_advantages:
        advantages = whiten(advantages, mask)
    return replace(experience, rewards=rewards, advantages=advantages, returns=returns)


def batch_moments(values: torch.Tensor, mask: torch.Tensor):
    """Mean and std of `values` where `mask` is 1, over every rank's rows (a collective: every rank calls it)."""
    return moments(all_reduce_sum(moment_sums(values.float(), mask)))


def grpo_advantages(experience: Experience, config: GRPOConfig) -> Experience:
    """GRPO's shaped scores, advantages and loss mask (`trainer.algorithms.advantages` has the formulas).

    Rows come in groups of `num_generations`. The overlong penalty is added to the scores first;
    dynamic sampling then drops groups whose (shaped) scores are all equal from the loss and from the
    batch statistics, and `mask_truncated_completions` drops truncated responses from the loss only
    (they still shape their group's baseline, as in TRL). `info` counts what was dropped and added,
    for the episode's metrics (`grpo_metrics`).
    """
    options = config.grpo
    mask = experience.action_mask.float()  # (B, T)
    scores = experience.scores.float()  # (B,)
    penalty = torch.zeros_like(scores)
    if options.overlong_buffer_length is not None:
        penalty = overlong_penalty(mask.sum(-1), max_length=config.generation.max_new_tokens,
                                   buffer_length=options.overlong_buffer_length, factor=options.overlong_penalty_factor)
        scores = scores + penalty
    n = options.num_generations
    kept = informative_rows(scores, n) if options.dynamic_sampling else torch.ones_like(scores)  # (B,)
    truncated = experience.truncated if experience.truncated is not None else torch.zeros_like(scores)
    has_kl = experience.ref_logps is not None and options.beta > 0 and not options.kl_in_loss
    kl = (experience.old_logps - experience.ref_logps) * mask if has_kl else torch.zeros_like(mask)  # k1, (B, T)
    scale = options.resolved_scale_rewards
    if options.advantage_estimator == "grpo":
        batch = batch_moments(scores, kept) if scale == "batch" else None
        advantages = group_advantages(scores, n, scale=scale, batch=batch)[:, None] * mask  # (B, T)
    elif options.advantage_estimator == "rloo":
        per_row = rloo_advantages(sequence_kl_penalty(scores, kl, mask, kl_coef=options.beta), n)  # (B,)
        if scale == "batch":
            per_row = normalise(per_row, batch_moments(per_row, kept))
        advantages = per_row[:, None] * mask
    else:  # reinforce_plus_plus
        advantages = reinforce_returns(scores, kl, mask, kl_coef=options.beta, gamma=options.gamma)  # (B, T)
        if scale == "batch":
            advantages = normalise(advantages, batch_moments(advantages, mask * kept[:, None]), mask)
    keep_in_loss = kept * (1 - truncated) if options.mask_truncated_completions else kept  # (B,)
    info = {"rows": float(len(scores)), "dropped_groups": float((1 - kept).sum()) / n,
            "truncated": float(truncated.sum()), "overlong_penalty": float(penalty.sum())}
    return replace(experience, advantages=advantages, loss_mask=mask * keep_in_loss[:, None],
                   info={**experience.info, **info})


def grpo_metrics(info: dict[str, float]) -> dict[str, float]:
    """The episode metrics of `grpo_advantages`' counts (summed over a batch's parts and ranks)."""
    rows = max(info.get("rows", 0.0), 1.0)
    return {"episode/dropped_groups": info.get("dropped_groups", 0.0),
            "episode/truncated_fraction": info.get("truncated", 0.0) / rows,
            "episode/overlong_penalty": info.get("overlong_penalty", 0.0) / rows}


def needs_reference(config: OnlineStageConfig) -> bool:
    """Whether the stage reads a frozen reference: GRPO with `beta` > 0; PPO with a KL penalty
    (`kl_coef` > 0) or a KL target. Without one, no reference model is loaded or run."""
    if isinstance(config, GRPOConfig):
        return config.grpo.beta > 0
    return config.ppo.kl_coef > 0 or config.ppo.target_kl is not None


def is_exactly_on_policy(config: OnlineStageConfig, sample_buffer: bool = False) -> bool:
    """Whether an episode takes exactly one optimizer step, on all of its experience.

    That step runs on the weights that sampled the rollout, so the "old" log-probs equal the
    current ones and need no forward of their own. With several minibatches or epochs, every step
    after the first sees updated weights and needs the old log-probs of the rollout.
    """
    options = config.algorithm
    rows_per_rank = options.rollout_batch_size * options.num_collect_steps * config.num_generations
    return options.num_update_epochs == 1 and (sample_buffer or rows_per_rank <= options.mini_batch_size)


def build_actor_objective(config: OnlineStageConfig) -> Any:
    """The policy objective of the stage: GRPO's, or PPO's clipped surrogate (+ entropy, ptx)."""
    if isinstance(config, GRPOConfig):
        options = config.grpo
        return GRPOObjective(
            epsilon=options.epsilon, epsilon_high=options.epsilon_high,
            beta=options.beta if options.kl_in_loss else 0.0, loss_type=options.loss_type,
            importance_sampling_level=options.importance_sampling_level,
            max_completion_length=config.generation.max_new_tokens,
            sapo_temperatures=(options.sapo_temperature_pos, options.sapo_temperature_neg),
            vespo_shape=(options.vespo_k_pos, options.vespo_lambda_pos, options.vespo_k_neg, options.vespo_lambda_neg),
            use_bias_correction_kl=options.use_bias_correction_kl)
    options = config.ppo
    return PPOActorObjective(cliprange=options.cliprange, entropy_coef=options.entropy_coef, ptx_coef=options.ptx_coef)


def build_critic_objective(config: OnlineStageConfig) -> Any:
    """PPO's clipped value objective (GRPO has no critic)."""
    return PPOCriticObjective(cliprange_value=config.ppo.cliprange_value, vf_coef=config.ppo.vf_coef)


def critic_metric_names(metrics: dict[str, float]) -> dict[str, float]:
    """The critic's step metrics under the names `trainer.algorithms.ppo` documents (`critic/grad_norm`, ...)."""
    return {k if k.startswith("value") else f"critic/{k}": v for k, v in metrics.items()}


def build_kl_controller(config: OnlineStageConfig) -> AdaptiveKLController:
    """PPO's reward KL coefficient (adaptive with `target_kl`); GRPO's is 0 (its KL is in the loss, `beta`)."""
    if isinstance(config, GRPOConfig):
        return AdaptiveKLController(0.0, None, 1)
    options = config.ppo
    return AdaptiveKLController(options.kl_coef, options.target_kl, options.kl_horizon)


def to_device(experience: Experience, device: torch.device, pin_memory: bool = False) -> Experience:
    """`experience` on `device`; CPU tensors bound for CUDA are pinned first when `pin_memory`, then
    copied without blocking (what the seed's `dataloader_pin_memory` asks of its DataLoader)."""
    if not (pin_memory and device.type == "cuda"):
        return experience.to(device)
    moved = {name: (tensor.pin_memory() if tensor.device.type == "cpu" else tensor).to(device, non_blocking=True)
             for name, tensor in experience.as_batch().items()}
    return replace(experience, **moved)


def micro_batches(minibatch: Experience, micro_batch_size: int, device: torch.device,
                  ptx: dict[str, torch.Tensor] | None = None, pin_memory: bool = False) -> list[dict]:
    """The micro-batches of one optimizer step, on `device`; each carries the ptx batch when given."""
    batches = [m.as_batch() for m in to_device(minibatch, device, pin_memory).split(micro_batch_size)]
    if ptx is not None:
        for batch in batches:
            batch.update(ptx_input_ids=ptx["input_ids"].to(device), ptx_labels=ptx["labels"].to(device))
    return batches


class PPOTrainer(OLTrainer):
    """PPO with an actor, a critic, a frozen reference and a reward source.

    Args:
        actor_booster, critic_booster, data_buffer, sample_buffer, dataloader_pin_memory, callbacks:
            As in `OLTrainer`.
        actor: (model, optimizer, scheduler) of the policy.
        critic: (model, optimizer, scheduler) of the value model; None for GRPO.
        ref_model: Frozen reference policy; None when the stage has no KL term (`needs_reference`).
        scorer: Scores rollouts (reward model or function), see `trainer.online.reward_sources`.
        tokenizer: Encodes prompts and decodes responses.
        config: The stage config.
        prompts: Prompt rows (`prompt`, optional `answer`).
        checkpoints: Saves actor, critic and the loop position.
        tracker: Receives metrics (no-op off rank 0).
        ptx_batches: Optional SFT batches for the pretraining loss, cycled through.
        stop_after_episodes: Save and stop after this episode count (a simulated preemption).
        engine: Samples the responses; default the stage's `rollout.engine` on the actor.

    With `sample_buffer` set, `fit` skips `_setup_update_phase_dataload` and each update step trains
    on one minibatch sampled (without replacement within the step) from the episode's experience.
    """

    def __init__(self, actor_booster: Booster, critic_booster: Booster | None, data_buffer: ReplayBuffer,
                 sample_buffer: bool = False, dataloader_pin_memory: bool = True, callbacks: list | None = None, *,
                 actor: ModelParts, critic: ModelParts | None, ref_model: nn.Module | None, scorer: Any,
                 tokenizer: Any, config: OnlineStageConfig, prompts: list[dict], checkpoints: CheckpointManager,
                 tracker: Tracker, ptx_batches: list[dict] | None = None, stop_after_episodes: int | None = None,
                 engine: RolloutEngine | None = None) -> None:
        super().__init__(actor_booster, critic_booster, data_buffer, sample_buffer, dataloader_pin_memory, callbacks)
        self.actor, self.actor_optimizer, self.actor_scheduler = actor
        self.critic, self.critic_optimizer, self.critic_scheduler = critic or (None, None, None)
        self.ref_model = ref_model
        self.scorer = scorer
        self.tokenizer = tokenizer
        self.config = config
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
        self.kl_controller = build_kl_controller(config)
        self.engine = engine if engine is not None else build_rollout_engine(config.rollout, self.actor,
                                                                             engine_setup(config))
        self.nonfinite = NonFiniteGuard(config.train.max_nonfinite_steps)
        self.critic_nonfinite = NonFiniteGuard(config.train.max_nonfinite_steps)
        self.last_metrics: dict[str, float] = {}
        self.samples: list[dict] = []  # a few (prompt, response, score) of the latest rollout, for reports
        self._experience: Experience | None = None  # the episode's experience, once concatenated

    # -- collect ------------------------------------------------------------------------------------

    def rollout(self, rows: list[dict]) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """Generate responses for `rows` (`num_generations` per prompt) and score them."""
        rows = [row for row in rows for _ in range(self.config.num_generations)]
        rollout = generate_and_score(self.engine, self.tokenizer, rows, self.config.generation, self.device, self.scorer)
        self.samples = rollout.samples(SAMPLES_KEPT)
        self.tracker.log_metrics(reward_metrics(self.scorer), self.global_step)  # rewards/<source>/mean, /std
        if self.config.rollout.is_correcting and rollout.engine_logps is not None:  # the engine's own log-probs
            return {**rollout.batch, "behaviour_logps": rollout.engine_logps}, rollout.scores
        return rollout.batch, rollout.scores

    @torch.no_grad()
    def _make_experience(self, collect_step: int) -> Experience:
        if collect_step == 0:
            self._experience = None  # a new episode
            self.engine.sync_from(self.actor)  # the last episode's updates (a no-op when it samples with the actor)
        batch, scores = self.rollout(self.prompts.take(self.options.rollout_batch_size))
        return self.annotate(batch, scores)

    @torch.no_grad()
    def annotate(self, batch: dict[str, torch.Tensor], scores: torch.Tensor, version: int = 0) -> Experience:
        """Add log-probs, values (PPO), rewards and advantages to freshly generated sequences.

        Old log-probs are left out when the update is exactly on-policy and no reference needs them
        (for the KL-shaped rewards and `episode/kl_to_ref`); reference log-probs without a reference.
        """
        mask = batch["action_mask"].float()
        values = response_values(self.critic, batch) * mask if self.critic is not None else None
        has_reference = self.ref_model is not None
        old_logps = None
        correcting = self.config.rollout.is_correcting
        if has_reference or correcting or not is_exactly_on_policy(self.config, self.sample_buffer):
            old_logps = response_logps(self.actor, batch) * mask
        if correcting and "behaviour_logps" not in batch:  # the hf engine sampled with these very weights
            batch = {**batch, "behaviour_logps": old_logps}
        ref_logps = response_logps(self.ref_model, batch) * mask if has_reference else None
        experience = Experience(**batch, scores=scores, old_logps=old_logps, ref_logps=ref_logps, values=values,
                                version=version)
        if correcting:
            experience, correction_metrics = correct_rollout(experience, self.config.rollout.correction)
            self.tracker.log_metrics(correction_metrics, self.global_step)
        return compute_advantages(experience, self.config, self.kl_controller.value)

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
        step = self.global_step + 1
        metrics = train_step(self.actor_booster, self.actor, self.actor_optimizer, self.actor_scheduler, batches,
                             build_actor_objective(self.config), self.config.optimizer.max_grad_norm)
        self.nonfinite.observe(metrics, step)  # a TrainingError after too many in a row
        metrics["train/nonfinite_skipped"] = float(self.nonfinite.total)
        if self.critic is not None:
            critic_metrics = train_step(self.critic_booster, self.critic, self.critic_optimizer, self.critic_scheduler,
                                        batches, build_critic_objective(self.config),
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
        counts = [experience.info.get(key, 0.0) for key in GRPO_COUNTS]  # GRPO's drops and penalties (else 0)
        local = torch.tensor([experience.scores.float().sum().item(), mask.sum().item(), kl_to_ref.sum().item(),
                              float(len(experience)), *counts], dtype=torch.float64, device=mask.device)
        score, tokens, kl, count, *counts = all_reduce_sum(local).tolist()
        metrics = {"episode/reward_mean": score / count, "episode/response_length": tokens / count,
                   "episode/kl_coef": self.kl_controller.value}
        if isinstance(self.config, GRPOConfig):
            metrics.update(grpo_metrics(dict(zip(GRPO_COUNTS, counts))))
        if has_kl:
            metrics["episode/kl_to_ref"] = kl / count
            self.kl_controller.update(kl / count, int(count))
        self.tracker.log_metrics(metrics, self.global_step)
        logger.info("episode %d: reward %.3f, length %.1f%s", self.num_episodes_done, metrics["episode/reward_mean"],
                    metrics["episode/response_length"], f", kl {kl / count:.4f}" if has_kl else "")

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
        self.engine.sync_from(self.actor)  # an engine with its own weights has not seen the last episode's updates
        greedy = self.config.generation.model_copy(update={"temperature": 0.0})
        means, _ = mean_score(self.engine, self.tokenizer, rows, greedy, self.device, [self.scorer], plugin.rank,
                              plugin.world_size)
        return means[0]


class GRPOTrainer(PPOTrainer):
    """GRPO: `num_generations` responses per prompt, group-normalised advantages, no critic.

    Everything GRPO-specific is chosen from the config by the shared functions above.
    """


def trainer_class(config: OnlineStageConfig) -> type[PPOTrainer]:
    return GRPOTrainer if isinstance(config, GRPOConfig) else PPOTrainer
