"""The objectives of an online stage, chosen from its config: what every optimizer step of the colocated
loop (`trainer.online.loop`) and of the asynchronous engine (`trainer.asynchronous.verl`) passes to
`trainer.algorithms.update.train_step`.

The objectives themselves (losses and their metrics) are `trainer.algorithms.grpo.GRPOObjective` and
`trainer.algorithms.ppo.PPOActorObjective`/`PPOCriticObjective`. Also here: whether an episode is
exactly on-policy, in which case the objective takes the current log-probs as the old ones
(`ppo.old_or_current_logps`) and no forward computes them.
"""

from __future__ import annotations

from typing import Any

from trainer.algorithms.grpo import GRPOObjective
from trainer.algorithms.ppo import PPOActorObjective, PPOCriticObjective
from trainer.algorithms.rollout_correction import CorrectionInUpdate
from trainer.config import GRPOConfig, OnlineStageConfig


def build_actor_objective(config: OnlineStageConfig, correction: CorrectionInUpdate | None = None) -> Any:
    """The policy objective of the stage: GRPO's, or PPO's clipped surrogate (+ entropy, ptx), with `correction`
    where the colocated loop takes the rollout correction in the update's forward."""
    if isinstance(config, GRPOConfig):
        options = config.grpo
        return GRPOObjective(
            epsilon=options.epsilon, epsilon_high=options.epsilon_high,
            beta=options.beta if options.kl_in_loss else 0.0, loss_type=options.loss_type,
            importance_sampling_level=options.importance_sampling_level,
            max_completion_length=config.generation.max_new_tokens,
            sapo_temperatures=(options.sapo_temperature_pos, options.sapo_temperature_neg),
            vespo_shape=(options.vespo_k_pos, options.vespo_lambda_pos, options.vespo_k_neg, options.vespo_lambda_neg),
            use_bias_correction_kl=options.use_bias_correction_kl, correction=correction)
    options = config.ppo
    return PPOActorObjective(cliprange=options.cliprange, entropy_coef=options.entropy_coef, ptx_coef=options.ptx_coef,
                             correction=correction)


def build_critic_objective(config: OnlineStageConfig) -> Any:
    """PPO's clipped value objective (GRPO has no critic)."""
    return PPOCriticObjective(cliprange_value=config.ppo.cliprange_value, vf_coef=config.ppo.vf_coef)


def critic_metric_names(metrics: dict[str, float]) -> dict[str, float]:
    """The critic's step metrics under the names `trainer.algorithms.ppo` documents (`critic/grad_norm`, ...)."""
    return {k if k.startswith("value") else f"critic/{k}": v for k, v in metrics.items()}


def is_exactly_on_policy(config: OnlineStageConfig, sample_buffer: bool = False) -> bool:
    """Whether an episode takes exactly one optimizer step, on all of its experience.

    That step runs on the weights that sampled the rollout, so the "old" log-probs equal the
    current ones and need no forward of their own. With several minibatches or epochs, every step
    after the first sees updated weights and needs the old log-probs of the rollout.

    Args:
        config: The stage config.
        sample_buffer: Whether each update step trains on one minibatch sampled from the episode.

    Returns:
        True when the old log-probs may be left out.
    """
    options = config.algorithm
    rows_per_rank = options.rollout_batch_size * options.num_collect_steps * config.num_generations
    return options.num_update_epochs == 1 and (sample_buffer or rows_per_rank <= options.mini_batch_size)
