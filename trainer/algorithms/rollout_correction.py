"""Importance weights for experience a different sampler produced: rollout correction and staleness.

The tokens of a batch were sampled by a behaviour policy pi_b (a vLLM engine whose kernels and
precision differ from the trainer's; or, in the asynchronous mode, an explorer holding older
weights) while the update assumes the trainer's policy pi (its log-probs `target_logps` of the same
tokens). Each token's loss is weighted by the importance ratio rho = pi / pi_b, bounded to
[C_min, C_max] in one of four ways (TRL's `vllm_importance_sampling_mode`, grpo_trainer 2026):

- granularity `token`: rho_t = exp(log pi(a_t) - log pi_b(a_t)) per token;
  `sequence`: one rho = exp(sum_t (log pi(a_t) - log pi_b(a_t))) per response, shared by its tokens;
- constraint `truncate` (TIS, Yao et al. 2025): rho <- clamp(rho, C_min, C_max);
  `mask` (MIS): rho <- 0 where rho < C_min or rho > C_max (the token or response leaves the loss).

The asynchronous mode's staleness correction is `token_truncate` with C_max =
`asynchronous.importance_sampling_cap` (`trainer.asynchronous.staleness`); the colocated loop's
rollout correction takes its mode from `rollout.correction` (`trainer.online.loop`), and when the
update is exactly on-policy it is taken in the update's own forward (`CorrectionInUpdate`). Both call
`importance_weights` below, so the two are one computation.

Statistics (detached, over response tokens; for sequence modes the ratio statistics are over
responses): `kl` (mean of log pi_b - log pi: a k1 estimate of KL(pi_b || pi) per token),
`clipped_fraction` (share of ratios outside the bounds, clipped or masked), `ratio_min`,
`ratio_max` (of the ratios before bounding), `weight_mean` (mean weight after bounding). The
colocated loop logs them as `rollout_correction/<stat>`.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from trainer.algorithms.common import masked_mean

MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")


def importance_weights(target_logps: Tensor, behaviour_logps: Tensor, mask: Tensor, *, mode: str,
                       clip_max: float | None, clip_min: float | None = None) -> tuple[Tensor, dict[str, Tensor]]:
    """Per-token importance weights pi / pi_b bounded as `mode` says, and their statistics.

    Args:
        target_logps: (B, T) the trainer's log-probs of the sampled tokens.
        behaviour_logps: (B, T) the sampler's log-probs of the same tokens.
        mask: (B, T) 1 on response tokens.
        mode: One of `MODES`.
        clip_max: C_max; None: no upper bound.
        clip_min: C_min; None: no lower bound.

    Returns:
        The weights (B, T), constants for the gradient, 1 outside `mask`; and the module docstring's
        statistics as 0-dim tensors.

    Naive equivalent of `token_truncate`: `w[b, t] = min(exp(target[b, t] - behaviour[b, t]), clip_max)`.
    """
    if mode not in MODES:
        raise ValueError(f"unknown importance sampling mode {mode!r}, expected one of {MODES}")
    mask = mask.float()
    log_ratio = (target_logps - behaviour_logps).detach().float() * mask  # (B, T), 0 off the response
    per_sequence = mode.startswith("sequence")
    if per_sequence:
        log_ratio = log_ratio.sum(-1, keepdim=True)  # (B, 1)
        units = (mask.sum(-1, keepdim=True) > 0).float()  # (B, 1) responses with at least one token
    else:
        units = mask  # (B, T)
    ratio = torch.exp(log_ratio)  # (B, T) or (B, 1); overflow to inf is bounded below
    low = -math.inf if clip_min is None else clip_min
    high = math.inf if clip_max is None else clip_max
    outside = ((ratio < low) | (ratio > high)).float()
    if mode.endswith("truncate"):
        weights = ratio.clamp(min=low, max=high)
    else:
        weights = ratio.masked_fill(outside > 0, 0.0)
    weights = torch.where(mask > 0, weights.expand_as(mask), torch.ones_like(mask))  # (B, T)
    shown = ratio[units > 0]  # the ratios over real tokens (or responses)
    empty = shown.numel() == 0
    statistics = {
        "kl": masked_mean(behaviour_logps.detach().float() - target_logps.detach().float(), mask),
        "clipped_fraction": masked_mean(outside.expand_as(units), units),
        "ratio_min": ratio.new_tensor(1.0) if empty else shown.min(),
        "ratio_max": ratio.new_tensor(1.0) if empty else shown.max(),
        "weight_mean": masked_mean(weights, mask),
    }
    return weights, statistics


class CorrectionInUpdate:
    """The rollout correction taken in the update's own forward, for an exactly on-policy update.

    The correction weighs each token by pi / pi_b, where pi is the trainer's log-prob of the sampled
    token. When the update's only optimizer step runs on the weights that sampled the rollout, the
    update's forward computes exactly those log-probs, so the separate forward over the rollout
    (`logps_old`) is not needed: each micro-batch's weights come from its current log-probs as constants.
    A row's weights depend on that row alone, so splitting into micro-batches changes nothing.

    The objectives call `weights`; the loop logs `statistics` (the same as `importance_weights`
    gives, over every row the step saw) after the step.

    Args:
        mode, clip_max, clip_min: As `importance_weights` takes them.
    """

    def __init__(self, mode: str, clip_max: float | None, clip_min: float | None = None) -> None:
        self.mode, self.clip_max, self.clip_min = mode, clip_max, clip_min
        self._seen: list[tuple[Tensor, Tensor, Tensor]] = []

    def weights(self, batch: dict[str, Tensor], logps: Tensor) -> Tensor | None:
        """The batch's importance weights: its own `importance_weights` when it has them; else, for a batch with
        the engine's `behaviour_logps` and no `old_logps` (the loop left both to the update), the correction's
        weights against the current `logps`; else None."""
        if "importance_weights" in batch:
            return batch["importance_weights"]
        if "behaviour_logps" not in batch or "old_logps" in batch:
            return None
        target = logps.detach()
        weights, _ = importance_weights(target, batch["behaviour_logps"], batch["action_mask"], mode=self.mode,
                                        clip_max=self.clip_max, clip_min=self.clip_min)
        self._seen.append((target, batch["behaviour_logps"], batch["action_mask"]))
        return weights

    def statistics(self) -> dict[str, float]:
        """The statistics of every row weighed since the last call (empty if none), and forget them."""
        if not self._seen:
            return {}
        target, behaviour, mask = (torch.cat(parts) for parts in zip(*self._seen))
        self._seen = []
        _, statistics = importance_weights(target, behaviour, mask, mode=self.mode, clip_max=self.clip_max,
                                           clip_min=self.clip_min)
        return {name: value.item() for name, value in statistics.items()}
