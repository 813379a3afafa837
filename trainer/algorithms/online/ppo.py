"""PPO as an online algorithm: a critic, a KL-shaped reward with an adaptive coefficient, GAE.

The formulas are in `trainer.algorithms.ppo` (Ziegler et al. 2019; Schulman et al. 2017), which also
lists the metrics its objectives emit; this class reads `config.ppo` and calls them.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from trainer.algorithms.online.base import OnlineAlgorithm
from trainer.algorithms.ppo import (
    AdaptiveKLController,
    PPOActorObjective,
    PPOCriticObjective,
    gae_advantages,
    kl_estimate,
    shape_rewards,
    whiten,
)
from trainer.algorithms.rollout_correction import CorrectionInUpdate
from trainer.config import PPOConfig
from trainer.rollout.experience import Experience


class PPOAlgorithm(OnlineAlgorithm):
    """PPO with a critic, a frozen reference (with a KL term) and an optional pretraining loss."""

    name = "ppo"
    needs_critic = True
    config: PPOConfig

    @property
    def needs_reference(self) -> bool:
        """A KL penalty (`kl_coef` > 0) or a KL target reads the KL to the reference."""
        return self.config.ppo.kl_coef > 0 or self.config.ppo.target_kl is not None

    @property
    def ptx_data_path(self) -> str | None:
        return self.config.ppo.ptx_data_path

    def build_kl_controller(self) -> AdaptiveKLController:
        """`kl_coef`, adaptive when `target_kl` is set."""
        options = self.config.ppo
        return AdaptiveKLController(options.kl_coef, options.target_kl, options.kl_horizon)

    def compute_advantages(self, experience: Experience, kl_coef: float) -> Experience:
        """Per-token KL-shaped rewards from `old_logps` and `ref_logps`, GAE, optional whitening; also sets
        `rewards` and `returns` (the critic's target)."""
        mask = experience.action_mask.float()  # (B, T)
        options = self.config.ppo
        if experience.ref_logps is None:  # no reference (`needs_reference`): no KL penalty to shape
            kl = torch.zeros_like(mask)
        else:
            kl = kl_estimate(experience.old_logps, experience.ref_logps, options.kl_estimator) * mask
        rewards = shape_rewards(experience.scores, kl, mask, kl_coef=kl_coef, reward_clip=options.reward_clip)
        advantages, returns = gae_advantages(rewards, experience.values, mask, gamma=options.gamma, lam=options.lam)
        if options.whiten_advantages:
            advantages = whiten(advantages, mask)
        return replace(experience, rewards=rewards, advantages=advantages, returns=returns)

    def build_actor_objective(self, correction: CorrectionInUpdate | None = None) -> PPOActorObjective:
        """The clipped surrogate, with the entropy bonus and the ptx loss."""
        options = self.config.ppo
        return PPOActorObjective(cliprange=options.cliprange, entropy_coef=options.entropy_coef,
                                 ptx_coef=options.ptx_coef, correction=correction)

    def build_critic_objective(self) -> PPOCriticObjective:
        """The clipped value loss, times `vf_coef`."""
        return PPOCriticObjective(cliprange_value=self.config.ppo.cliprange_value, vf_coef=self.config.ppo.vf_coef)


def critic_metric_names(metrics: dict[str, float]) -> dict[str, float]:
    """The critic's step metrics under the names `trainer.algorithms.ppo` documents (`critic/grad_norm`, ...)."""
    return {k if k.startswith("value") else f"critic/{k}": v for k, v in metrics.items()}
