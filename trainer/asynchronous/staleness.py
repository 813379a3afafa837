"""Stale experience: how old a batch is, when it is rejected, and how the rest is importance-corrected.

An explorer generates with the newest weight version it has loaded, which may be older than the
trainer's: a batch is `staleness` versions old when the trainer (at weight version
`train_step_num`) receives a batch generated with version `v`: staleness = train_step_num - v.

- A batch older than `asynchronous.max_staleness` is rejected before training: it is dropped,
  counted, and the count logged as `staleness/rejected`. The default limit,
  sync_offset + sync_interval - 1, is the most the explorer's protocol produces, so only batches
  from elsewhere (a buffer left by an earlier run, an explorer with other settings) are dropped.
- Every accepted batch carries the explorer's per-token log-probs (`behaviour_logps`). The engine
  recomputes them under its current weights (`old_logps`, the proximal policy) and learns with the
  decoupled PPO objective, each token weighted by w = min(pi_old / pi_behav, cap) with
  cap = `asynchronous.importance_sampling_cap`: formula and references in `trainer.algorithms.ppo`;
  the weights are `trainer.algorithms.rollout_correction`'s `token_truncate` mode.
  A fresh batch (staleness 0) gets w = 1 up to float rounding, so nothing changes on-policy.

Logged metrics (each trainer step): `staleness/mean`, `staleness/max` (versions, over the rows);
`staleness/rejected` (batches rejected so far in this process); `staleness/importance_weight`
(mean w over response tokens); `staleness/truncated_fraction` (share of response tokens whose
weight hit the cap); `staleness/behaviour_kl` (mean log pi_behav - log pi_old over response
tokens: a k1 estimate of KL(pi_behav || pi_old) per token).
"""

from __future__ import annotations

from torch import Tensor

from trainer.algorithms.rollout_correction import importance_weights
from trainer.rollout.experience import Experience


def batch_staleness(current_version: int, model_versions: Tensor) -> Tensor:
    """Versions between the trainer's policy and the one that generated each row. (B,) -> (B,)."""
    return current_version - model_versions


def is_too_stale(experience: Experience, current_version: int, max_staleness: int) -> bool:
    """Whether the batch was generated more than `max_staleness` versions before `current_version`."""
    return current_version - experience.version > max_staleness


def staleness_metrics(current_version: int, model_versions: Tensor) -> dict[str, float]:
    staleness = batch_staleness(current_version, model_versions).float()
    return {"staleness/mean": staleness.mean().item(), "staleness/max": staleness.max().item()}


def importance_correction(experience: Experience, cap: float) -> tuple[dict[str, Tensor], dict[str, float]]:
    """Truncated per-token weights for a batch with `old_logps` and `behaviour_logps`, and their metrics.

    Returns:
        `{"importance_weights": (B, T)}` to add to the batch (empty when the batch has no
        behaviour log-probs), and the `staleness/*` weight metrics of the module docstring.
    """
    if experience.behaviour_logps is None:
        return {}, {}
    # One computation with the colocated loop's rollout correction: token-level truncation at the cap.
    weights, statistics = importance_weights(experience.old_logps, experience.behaviour_logps,
                                             experience.action_mask, mode="token_truncate", clip_max=cap)
    metrics = {
        "staleness/importance_weight": statistics["weight_mean"].item(),
        "staleness/truncated_fraction": statistics["clipped_fraction"].item(),
        "staleness/behaviour_kl": statistics["kl"].item(),
    }
    return {"importance_weights": weights}, metrics
