"""GRPO: critic-free policy optimisation with group-normalised advantages (Shao et al. 2024).

For each prompt, `num_generations` responses are sampled and scored; a response's advantage is
its score minus the group mean, divided by the group std (eq. 3, outcome supervision), and is
shared by all its tokens. The loss per token is the PPO clipped surrogate (`ppo.clipped_policy_loss`)
plus `beta` times the k3 KL estimate to the reference (eq. 4). Aggregation:
- `token`: mean over every response token of the global batch (DAPO-style, no length bias);
- `sequence`: mean over tokens within each response, then over responses (the paper's eq. 3).

With `beta` 0 (as in DAPO and Dr. GRPO) there is no KL term: no reference model is loaded or run,
and `kl/ref` is not logged. When the update is exactly on-policy (one optimizer step per rollout)
the batch carries no `old_logps`: the ratio is taken against the current log-probs as constants
(`ppo.old_or_current_logps`), which equals the explicit forward on the same weights.

A group whose responses all score the same carries no signal: its advantages are 0 (not NaN).
Stale experience from the asynchronous engine is corrected as `ppo` describes (the batch's
`importance_weights` multiply the clipped surrogate; the KL term is left unweighted).

Logged metrics: `loss`, `kl/ref` (mean k3 to the reference; only with `beta` > 0), `clip_fraction`.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from trainer.algorithms.common import LossOutput
from trainer.algorithms.ppo import clipped_policy_loss, kl_estimate, old_or_current_logps, response_logps


def group_advantages(scores: Tensor, num_generations: int, *, scale: bool = True, eps: float = 1e-6) -> Tensor:
    """Group-normalised advantages. scores (B,) with B = groups * num_generations, consecutive per group.

    Returns (B,): (score - group mean) / group std, or only centred when `scale` is False;
    0 for groups whose scores are all equal.
    """
    grouped = scores.view(-1, num_generations)  # (G, n)
    centred = grouped - grouped.mean(dim=1, keepdim=True)
    if scale:
        std = grouped.std(dim=1, keepdim=True)  # (G, 1), unbiased as in the paper's implementation
        centred = torch.where(std > eps, centred / std.clamp(min=eps), torch.zeros_like(centred))
    return centred.reshape(-1)


class GRPOObjective:
    """Clipped surrogate plus beta * k3 KL to the reference, on a minibatch of experience."""

    def __init__(self, *, epsilon: float, beta: float, loss_aggregation: str = "token") -> None:
        self.epsilon = epsilon
        self.beta = beta
        self.loss_aggregation = loss_aggregation

    def count_units(self, batch: dict[str, Tensor]) -> Tensor:
        if self.loss_aggregation == "token":
            return batch["action_mask"].sum().float()
        return torch.tensor(float(batch["action_mask"].shape[0]), device=batch["action_mask"].device)

    def __call__(self, model: nn.Module, batch: dict[str, Tensor]) -> LossOutput:
        mask = batch["action_mask"].float()  # (B, T)
        logps = response_logps(model, batch)  # (B, T)
        advantages = batch["advantages"]  # (B, T): the sequence advantage on every response token
        losses, clipped = clipped_policy_loss(logps, old_or_current_logps(batch, logps), advantages,
                                              cliprange=self.epsilon, importance_weights=batch.get("importance_weights"))
        if self.loss_aggregation == "token":
            weights = mask
        else:  # each response weighs 1, spread evenly over its tokens
            weights = mask / mask.sum(-1, keepdim=True).clamp(min=1)
        per_token = losses  # (B, T)
        stats = {"clip_fraction": (clipped * weights).sum()}
        if self.beta > 0:  # beta 0: the batch has no reference log-probs, and the term would be 0
            kl = kl_estimate(logps, batch["ref_logps"], "k3")  # (B, T)
            per_token = losses + self.beta * kl
            stats["kl/ref"] = (kl.detach() * weights).sum()
        stats["loss"] = (per_token.detach() * weights).sum()
        return LossOutput(total=(per_token * weights).sum(), count=self.count_units(batch), stats=stats)
