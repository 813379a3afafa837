"""GRPO as an online algorithm: groups of `num_generations` responses, a critic-free advantage, no critic.

The formulas are in `trainer.algorithms.advantages` (GRPO, RLOO, REINFORCE++, DAPO's shaping) and
`trainer.algorithms.grpo` (the policy losses and their metrics); this class reads `config.grpo`,
applies them to an `Experience` and sums batch statistics over every rank.

Metrics (`episode_metrics`): `episode/dropped_groups`, `episode/truncated_fraction`,
`episode/overlong_penalty`.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from trainer.algorithms.advantages import (
    Moments,
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
from trainer.algorithms.online.base import OnlineAlgorithm
from trainer.algorithms.ppo import AdaptiveKLController
from trainer.algorithms.rollout_correction import CorrectionInUpdate
from trainer.config import GRPOConfig
from trainer.rollout.experience import Experience
from trainer.runtime import all_reduce_sum


def batch_moments(values: torch.Tensor, mask: torch.Tensor) -> Moments:
    """Mean and std of `values` where `mask` is 1, over every rank's rows (a collective: every rank calls it)."""
    return moments(all_reduce_sum(moment_sums(values.float(), mask)))


class GRPOAlgorithm(OnlineAlgorithm):
    """GRPO and its variants (Dr. GRPO, RLOO, REINFORCE++, DAPO's shaping, GSPO, ...), by `config.grpo`."""

    name = "grpo"
    counted_info = ("rows", "dropped_groups", "truncated", "overlong_penalty")
    config: GRPOConfig

    @property
    def needs_reference(self) -> bool:
        """`beta` > 0: the KL to the reference is in the loss or the advantages."""
        return self.config.grpo.beta > 0

    def build_kl_controller(self) -> AdaptiveKLController:
        """A reward KL coefficient of 0: GRPO's KL is in its loss or its advantages (`beta`)."""
        return AdaptiveKLController(0.0, None, 1)

    def compute_advantages(self, experience: Experience, kl_coef: float) -> Experience:
        """GRPO's shaped scores, advantages and loss mask; `kl_coef` is unused (the KL weight is `beta`).

        Rows come in groups of `num_generations`. The overlong penalty is added to the scores first;
        dynamic sampling then drops groups whose (shaped) scores are all equal from the loss and from the
        batch statistics, and `mask_truncated_completions` drops truncated responses from the loss only
        (they still shape their group's baseline, as in TRL).

        Returns:
            A copy with `advantages`, `loss_mask` and the counts of `counted_info` in `info`.
        """
        options = self.config.grpo
        mask = experience.action_mask.float()  # (B, T)
        scores = experience.scores.float()  # (B,)
        penalty = torch.zeros_like(scores)
        if options.overlong_buffer_length is not None:
            penalty = overlong_penalty(mask.sum(-1), max_length=self.config.generation.max_new_tokens,
                                       buffer_length=options.overlong_buffer_length,
                                       factor=options.overlong_penalty_factor)
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

    def build_actor_objective(self, correction: CorrectionInUpdate | None = None) -> GRPOObjective:
        """The policy loss `grpo.loss_type` names, with `beta`'s k3 KL when the KL is in the loss."""
        options = self.config.grpo
        return GRPOObjective(
            epsilon=options.epsilon, epsilon_high=options.epsilon_high,
            beta=options.beta if options.kl_in_loss else 0.0, loss_type=options.loss_type,
            importance_sampling_level=options.importance_sampling_level,
            max_completion_length=self.config.generation.max_new_tokens,
            sapo_temperatures=(options.sapo_temperature_pos, options.sapo_temperature_neg),
            vespo_shape=(options.vespo_k_pos, options.vespo_lambda_pos, options.vespo_k_neg, options.vespo_lambda_neg),
            use_bias_correction_kl=options.use_bias_correction_kl, correction=correction)

    def episode_metrics(self, info: dict[str, float]) -> dict[str, float]:
        """What dynamic sampling dropped, the share of truncated responses and the mean overlong penalty."""
        rows = max(info.get("rows", 0.0), 1.0)
        return {"episode/dropped_groups": info.get("dropped_groups", 0.0),
                "episode/truncated_fraction": info.get("truncated", 0.0) / rows,
                "episode/overlong_penalty": info.get("overlong_penalty", 0.0) / rows}
