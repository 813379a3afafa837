"""The KL term of an online stage: its reward KL coefficient (PPO's adaptive controller) and whether
the stage needs a frozen reference at all.

`trainer.algorithms.ppo.AdaptiveKLController` is the controller (Ziegler et al. 2019); this module
builds it from the stage config. GRPO's KL lives in its loss or its advantages (`grpo.beta`), so
its reward coefficient is 0.
"""

from __future__ import annotations

from trainer.algorithms.ppo import AdaptiveKLController
from trainer.config import GRPOConfig, OnlineStageConfig


def build_kl_controller(config: OnlineStageConfig) -> AdaptiveKLController:
    """PPO's reward KL coefficient (adaptive with `target_kl`); GRPO's is 0 (its KL is in the loss, `beta`)."""
    if isinstance(config, GRPOConfig):
        return AdaptiveKLController(0.0, None, 1)
    options = config.ppo
    return AdaptiveKLController(options.kl_coef, options.target_kl, options.kl_horizon)


def needs_reference(config: OnlineStageConfig) -> bool:
    """Whether the stage reads a frozen reference: GRPO with `beta` > 0; PPO with a KL penalty
    (`kl_coef` > 0) or a KL target. Without one, no reference model is loaded or run."""
    if isinstance(config, GRPOConfig):
        return config.grpo.beta > 0
    return config.ppo.kl_coef > 0 or config.ppo.target_kl is not None
