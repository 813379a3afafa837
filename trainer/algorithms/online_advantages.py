"""Rewards and advantages of an online batch: what the colocated loop (`trainer.online.loop`) and the
asynchronous engine (`trainer.asynchronous.verl`) both call once a batch's log-probs are filled in.

The formulas themselves live in `trainer.algorithms.advantages` (GRPO, RLOO, REINFORCE++, DAPO's
shaping) and `trainer.algorithms.ppo` (KL-shaped rewards, GAE, whitening); this module picks them from
the stage config and applies them to an `Experience`. Batch statistics are summed over every rank.

Metrics (from `grpo_metrics`): `episode/dropped_groups`, `episode/truncated_fraction`,
`episode/overlong_penalty`.
"""

from __future__ import annotations

from dataclasses import replace

import torch

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
from trainer.algorithms.ppo import gae_advantages, kl_estimate, shape_rewards, whiten
from trainer.config import GRPOConfig, OnlineStageConfig
from trainer.online.experience import Experience
from trainer.runtime import all_reduce_sum

GRPO_COUNTS = ("rows", "dropped_groups", "truncated", "overlong_penalty")  # what `grpo_advantages` counts in `info`


def compute_advantages(experience: Experience, config: OnlineStageConfig, kl_coef: float) -> Experience:
    """Rewards and advantages of a batch whose log-probs (and, for PPO, values) are filled in.

    PPO: per-token KL-shaped rewards from `old_logps` and `ref_logps`, GAE, optional whitening.
    GRPO: `grpo_advantages`.

    Args:
        experience: The batch, with `scores`, `old_logps` (when a reference is used), `ref_logps` and
            (PPO) `values` set.
        config: The stage config; its class picks PPO or GRPO.
        kl_coef: PPO's current reward KL coefficient (`build_kl_controller`); unused by GRPO.

    Returns:
        A copy with `rewards`/`returns` (PPO) and `advantages` set.
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

    Args:
        experience: The batch, rows grouped by prompt.
        config: The GRPO stage config.

    Returns:
        A copy with `advantages`, `loss_mask` and the counts of `GRPO_COUNTS` in `info`.
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
