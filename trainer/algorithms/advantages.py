"""Critic-free advantage estimators of the GRPO stage, and the reward shaping that comes before them.

Rows come in groups of `num_generations` responses to one prompt (consecutive rows). With r the
sequence score of each response:

- `grpo` (Shao et al. 2024, "DeepSeekMath", eq. 3, outcome supervision):
  A_i = (r_i - mean(group)) / (s + 1e-4), the same A_i on every token of response i; s is the
  group's std (`scale_rewards: group`), the batch's std of r (`batch`, Hu et al. 2025, "PPO-Lite"
  / "Tricks or Traps") or 1 (`none`: Dr. GRPO, Liu et al. 2025, eq. 5 drops the std, which weighs
  easy and hard prompts alike). 1e-4 is TRL's; a group whose scores are all equal gets 0.
- `rloo` (Ahmadian et al. 2024, "Back to Basics", eq. 8; Kool et al. 2019):
  A_i = r_i - mean_{j != i} r_j, the leave-one-out baseline, optionally divided by the batch's std
  of A (`scale_rewards: batch`; TRL's `normalize_advantages`, which also subtracts its mean).
- `reinforce_plus_plus` (Hu 2025, "REINFORCE++", eqs. 5-7): every response token t gets
  r_t = -beta * KL_t, the last one also the score; the advantage is the return-to-go
  G_t = sum_{s >= t} gamma^(s-t) r_s, normalised with the mean and std of G over every response
  token of the global batch (`scale_rewards: batch`) or left as it is (`none`).

The statistics of a whole batch (`batch`) span every rank: the caller sums `moment_sums` over ranks
and passes the `Moments` in, so these functions stay pure.

Reward shaping, applied to the scores before any estimator: DAPO's soft overlong punishment (Yu et
al. 2025, "DAPO", eq. 13, `overlong_penalty`) and its dynamic sampling (section 3.2:
`informative_rows`, groups whose responses all score the same are dropped from the loss).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from trainer.algorithms.ppo import gae_advantages, shape_rewards

STD_EPS = 1e-4  # added to a std before dividing by it (TRL's value)


@dataclass(frozen=True, slots=True)
class Moments:
    """Mean and unbiased std of a set of values (one batch, all ranks)."""

    mean: Tensor
    std: Tensor


def moment_sums(values: Tensor, mask: Tensor) -> Tensor:
    """(3,) count, sum and sum of squares of `values` where `mask` is 1; sum them over ranks, then `moments`."""
    mask = mask.to(values.dtype)
    return torch.stack([mask.sum(), (values * mask).sum(), (values.square() * mask).sum()])


def moments(sums: Tensor) -> Moments:
    """Mean and unbiased std from `moment_sums` (summed over ranks); std 0 for fewer than two values."""
    count, total, squares = sums.unbind()
    mean = total / count.clamp(min=1)
    variance = (squares - count * mean.square()) / (count - 1).clamp(min=1)
    return Moments(mean, variance.clamp(min=0).sqrt() * (count > 1))


def group_advantages(scores: Tensor, num_generations: int, *, scale: str = "group",
                     batch: Moments | None = None) -> Tensor:
    """GRPO's group-relative advantage (see the module docstring), one per response.

    Args:
        scores: (B,) sequence scores, B = groups * num_generations, consecutive per group.
        num_generations: The group size n.
        scale: `group` (divide by the group's unbiased std), `batch` (by the batch's std of the
            scores, `batch` required) or `none`.
        batch: Moments of the scores over the whole batch (all ranks), for `scale="batch"`.

    Returns:
        (B,) advantages; 0 for every response of a group whose scores are all equal.
    """
    grouped = scores.view(-1, num_generations)  # (G, n)
    centred = grouped - grouped.mean(dim=1, keepdim=True)  # (G, n)
    if scale == "group":
        std = grouped.std(dim=1, keepdim=True) if num_generations > 1 else torch.zeros_like(centred)  # (G, 1)
        centred = centred / (std + STD_EPS)
    elif scale == "batch":
        centred = centred / (batch.std + STD_EPS)
    return centred.reshape(-1)  # (B,)


def rloo_advantages(scores: Tensor, num_generations: int) -> Tensor:
    """Leave-one-out advantages r_i - mean of the other n - 1 scores of the group. (B,) -> (B,).

    Equals n / (n - 1) * (r_i - mean(group)): the group-centred score, unbiased for the baseline.
    """
    grouped = scores.view(-1, num_generations)  # (G, n)
    baseline = (grouped.sum(dim=1, keepdim=True) - grouped) / (num_generations - 1)  # (G, n)
    return (grouped - baseline).reshape(-1)  # (B,)


def normalise(values: Tensor, batch: Moments, mask: Tensor | None = None) -> Tensor:
    """(values - mean) / (std + 1e-4) with the batch's moments; 0 where `mask` is 0. Any shape."""
    normalised = (values - batch.mean) / (batch.std + STD_EPS)
    return normalised if mask is None else normalised * mask


def sequence_kl_penalty(scores: Tensor, kl: Tensor, action_mask: Tensor, *, kl_coef: float) -> Tensor:
    """RLOO's KL-regularised score r - beta * sum_t KL_t (Ahmadian et al. 2024, eq. 2; TRL's RLOO).

    Args:
        scores: (B,) sequence scores.
        kl: (B, T) per-token k1 estimates log pi_old - log ref.
        action_mask: (B, T) 1 on response tokens.
        kl_coef: beta.

    Returns:
        (B,) penalised scores.
    """
    return scores - kl_coef * (kl * action_mask).sum(-1)


def reinforce_returns(scores: Tensor, kl: Tensor, action_mask: Tensor, *, kl_coef: float, gamma: float) -> Tensor:
    """REINFORCE++'s per-token returns-to-go before normalisation (Hu 2025, eqs. 5-6).

    Token rewards are -kl_coef * KL_t with the score added on the last response token
    (`ppo.shape_rewards`); the return G_t = sum_{s >= t} gamma^(s-t) r_s over response tokens is
    GAE with zero values and lambda 1 (`ppo.gae_advantages`), which computes exactly that sum.

    Args:
        scores: (B,) sequence scores.
        kl: (B, T) per-token k1 estimates (0 without a reference).
        action_mask: (B, T) 1 on response tokens.
        kl_coef: beta, the KL penalty per token.
        gamma: The discount.

    Returns:
        (B, T) returns, 0 outside the response.
    """
    mask = action_mask.float()
    rewards = shape_rewards(scores, kl * mask, mask, kl_coef=kl_coef)  # (B, T)
    returns, _ = gae_advantages(rewards, torch.zeros_like(rewards), mask, gamma=gamma, lam=1.0)
    return returns


def overlong_penalty(lengths: Tensor, *, max_length: int, buffer_length: int, factor: float = 1.0) -> Tensor:
    """DAPO's soft overlong punishment (Yu et al. 2025, eq. 13), added to the score. (B,) -> (B,).

    0 up to `max_length - buffer_length` tokens, then falling linearly to -factor at `max_length`
    (and beyond: -factor).
    """
    threshold = max_length - buffer_length
    return factor * ((threshold - lengths.float()) / buffer_length).clamp(min=-1.0, max=0.0)


def informative_rows(scores: Tensor, num_generations: int) -> Tensor:
    """1.0 for the rows of groups whose scores differ, 0.0 for groups that all score the same. (B,) -> (B,).

    DAPO's dynamic sampling drops the latter: their group-relative advantage is 0, so they would
    only dilute the batch.
    """
    grouped = scores.view(-1, num_generations)  # (G, n)
    differs = (grouped != grouped[:, :1]).any(dim=1, keepdim=True)  # (G, 1)
    return differs.expand_as(grouped).reshape(-1).float()  # (B,)
