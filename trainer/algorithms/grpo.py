"""GRPO and its variants: critic-free policy losses over groups of sampled responses.

The advantages come from `trainer.algorithms.advantages` (GRPO, RLOO, REINFORCE++). The loss per
token is a policy term plus, when the KL is in the loss (the `grpo` estimator), `beta` times the k3
estimate of KL(pi || ref) (Shao et al. 2024, eq. 4). With r the importance ratio pi / pi_old:

- `grpo`, `dr_grpo`, `dapo`, `bnpo`, `luspo`: PPO's clipped surrogate
  -min(r A, clip(r, 1 - epsilon, 1 + epsilon_high) A) (Schulman et al. 2017, eq. 7); `epsilon_high`
  above `epsilon` is DAPO's clip-higher (Yu et al. 2025, section 3.1).
- `cispo` (MiniMax 2025, "MiniMax-M1", eq. 4): -sg(min(r, epsilon_high)) A log pi; the weight is
  clipped instead of the update, so clipped tokens still carry gradient.
- `sapo` (Gao et al. 2025, "Soft Adaptive Policy Optimization"): -(4 / tau) sigmoid(tau (r - 1)) A,
  a smooth gate instead of the clip; tau is `sapo_temperature_pos` for A > 0, `_neg` otherwise.
- `vespo` (VESPO, 2026): -sg(phi(w)) A log pi with w the sequence's ratio prod_t r_t and
  phi(w) = e^lambda w^k e^(-lambda w) (k, lambda by the sign of A; phi(1) = 1).

`importance_sampling_level: sequence` is GSPO (Zheng et al. 2025, eq. 7): one ratio per response,
exp(mean_t log r_t), shared by its tokens. `use_bias_correction_kl` multiplies the KL term by r
(DeepSeek-V3.2, 2025: the unbiased reverse-KL gradient off-policy; TRL's default, not the GRPO paper's).

How the per-token losses L of a batch become one number (`loss_type`; the units a step averages
over, across micro-batches and ranks, `trainer.algorithms.update.train_step`):

| loss_type | the step's loss | unit |
|---|---|---|
| `grpo`, `sapo` | mean over responses of each response's token mean (Shao et al. eq. 3) | a response with tokens |
| `dapo`, `cispo`, `vespo` | sum over tokens / active tokens of the global batch (DAPO eq. 12) | a token |
| `dr_grpo` | sum over tokens / (responses x max_new_tokens) (Liu et al. 2025, eq. 5) | a response (any) |
| `bnpo` | mean over micro-batches of sum / the micro-batch's active tokens (TRL's `bnpo`) | a micro-batch |
| `luspo` | mean over responses of the response's token sum (LUSPO: GSPO scaled by length) | a response (any) |

`grpo` leaves out a response with no active token (dynamic sampling or `mask_truncated_completions`
dropped it); `dr_grpo` and `luspo` count every row, so their normaliser stays a constant. `bnpo` is
the only one whose value depends on how the batch is split (that is its definition).

Which tokens count: `loss_mask` when the batch carries one (rows that dynamic sampling or
`mask_truncated_completions` dropped are 0), else `action_mask`. When the update is exactly on-policy
the batch has no `old_logps` and the ratio is taken against the current log-probs as constants
(`ppo.old_or_current_logps`). Stale experience of the asynchronous engine and the rollout correction
multiply the policy term by the batch's `importance_weights` (or, exactly on-policy, by the weights
`CorrectionInUpdate` takes from this forward); the KL term is left unweighted.

Logged metrics (each averaged the way the loss is): `loss`, `clip_fraction` (share of tokens whose
update the clip cut off: r below 1 - epsilon with A < 0 or above 1 + epsilon_high with A > 0; for
`cispo`, r above epsilon_high with A > 0), `kl/ref` (k3 to the reference; only with the KL in the loss).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from trainer.algorithms.common import LossOutput
from trainer.algorithms.ppo import clipped_surrogate, kl_estimate, old_or_current_logps, response_logps
from trainer.algorithms.rollout_correction import CorrectionInUpdate

LOSS_TYPES = ("grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo", "vespo")
CLIPPED_LOSS_TYPES = ("grpo", "dr_grpo", "dapo", "bnpo", "luspo")


def importance_log_ratio(logps: Tensor, old_logps: Tensor, mask: Tensor, level: str = "token") -> Tensor:
    """log(pi / pi_old) per token (B, T), or GSPO's per-sequence mean over active tokens (B, 1)."""
    log_ratio = logps - old_logps  # (B, T)
    if level == "token":
        return log_ratio
    return ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1)).unsqueeze(-1)  # (B, 1)


def cispo_loss(ratio: Tensor, logps: Tensor, advantages: Tensor, *, cap: float) -> tuple[Tensor, Tensor]:
    """CISPO per token: -sg(min(r, cap)) A log pi, and where the weight was capped with A > 0. (B, T) each."""
    weight = ratio.clamp(max=cap).detach()
    return -weight * advantages * logps, ((ratio > cap) & (advantages > 0)).float().expand_as(logps)


def sapo_loss(ratio: Tensor, advantages: Tensor, *, temperature_pos: float, temperature_neg: float) -> Tensor:
    """SAPO per token: -(4 / tau) sigmoid(tau (r - 1)) A, whose gradient at r = 1 is PPO's. Broadcasts like `ratio`."""
    tau = torch.where(advantages > 0, temperature_pos, temperature_neg)
    return -torch.sigmoid(tau * (ratio - 1)) * 4 / tau * advantages


@torch.no_grad()
def vespo_weights(log_ratio: Tensor, mask: Tensor, advantages: Tensor, *, k_pos: float, lambda_pos: float,
                  k_neg: float, lambda_neg: float) -> Tensor:
    """VESPO's sequence weight phi(w) = e^lambda w^k e^(-lambda w), w = exp(sum_t log r_t), computed in log space.

    Args:
        log_ratio: (B, T) per-token log(pi / pi_old).
        mask: (B, T) active tokens.
        advantages: (B, T); the sign of each token's advantage picks (k, lambda).

    Returns:
        (B, T) weights, constants for the gradient; log w is clamped to [log 1e-8, 20] as TRL does.
    """
    log_w = (log_ratio.clamp(-20.0, 20.0) * mask).sum(-1, keepdim=True).clamp(math.log(1e-8), 20.0)  # (B, 1)
    is_positive = advantages >= 0  # (B, T)
    k = torch.where(is_positive, k_pos, k_neg)
    lam = torch.where(is_positive, lambda_pos, lambda_neg).clamp(min=1e-4)
    return torch.exp(lam + k * log_w - lam * log_w.exp()).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)


def policy_loss(logps: Tensor, old_logps: Tensor, advantages: Tensor, mask: Tensor, *, loss_type: str,
                epsilon: float, epsilon_high: float, level: str = "token", sapo_temperatures: tuple = (1.0, 1.05),
                vespo_shape: tuple = (2.0, 3.0, 3.0, 2.0)) -> tuple[Tensor, Tensor, Tensor]:
    """The policy term per token and where it was clipped, for every `loss_type` (module docstring).

    Args:
        logps, old_logps: (B, T) log-probs under the policy and under the one that sampled (or the proximal one).
        advantages: (B, T) advantages on response tokens.
        mask: (B, T) active tokens.
        loss_type: One of `LOSS_TYPES`.
        epsilon, epsilon_high: Clip range [1 - epsilon, 1 + epsilon_high]; `cispo` caps the ratio at `epsilon_high`.
        level: `token` ratios, or `sequence` (GSPO).
        sapo_temperatures: (tau for A > 0, tau for A <= 0).
        vespo_shape: (k_pos, lambda_pos, k_neg, lambda_neg).

    Returns:
        (B, T) losses (before masking), (B, T) clip indicators, and the ratio r ((B, T), or (B, 1) for
        sequence ratios) with its gradient.
    """
    log_ratio = importance_log_ratio(logps, old_logps, mask, level)  # (B, T) or (B, 1)
    ratio = torch.exp(log_ratio)
    if loss_type in CLIPPED_LOSS_TYPES:
        losses, clipped = clipped_surrogate(ratio, advantages, low=epsilon, high=epsilon_high)
    elif loss_type == "cispo":
        losses, clipped = cispo_loss(ratio, logps, advantages, cap=epsilon_high)
    elif loss_type == "sapo":
        losses = sapo_loss(ratio, advantages, temperature_pos=sapo_temperatures[0],
                           temperature_neg=sapo_temperatures[1])
        clipped = torch.zeros_like(logps)
    elif loss_type == "vespo":
        k_pos, lambda_pos, k_neg, lambda_neg = vespo_shape
        phi = vespo_weights(logps - old_logps, mask, advantages, k_pos=k_pos, lambda_pos=lambda_pos, k_neg=k_neg,
                            lambda_neg=lambda_neg)  # (B, T)
        losses, clipped = -phi * advantages * logps, torch.zeros_like(logps)
    else:
        raise ValueError(f"unknown loss_type {loss_type!r}, expected one of {LOSS_TYPES}")
    return losses.expand_as(logps), clipped.expand_as(logps), ratio


def aggregation_weights(mask: Tensor, loss_type: str, max_completion_length: int | None = None) -> tuple[Tensor, Tensor]:
    """Per-token weights w and unit count c such that the step's loss is sum(w * L) / c (module docstring table).

    Args:
        mask: (B, T) active tokens of one micro-batch.
        loss_type: One of `LOSS_TYPES`.
        max_completion_length: `dr_grpo`'s constant (the longest response the rollout samples).

    Returns:
        w (B, T) and c () for this micro-batch; `train_step` sums c over micro-batches and ranks.
    """
    mask = mask.float()
    row_tokens = mask.sum(-1, keepdim=True)  # (B, 1)
    num_rows = torch.tensor(float(mask.shape[0]), device=mask.device)
    if loss_type in ("grpo", "sapo"):
        return mask / row_tokens.clamp(min=1), (row_tokens > 0).float().sum()
    if loss_type == "dr_grpo":
        return mask / max_completion_length, num_rows
    if loss_type == "bnpo":
        return mask / mask.sum().clamp(min=1), torch.ones((), device=mask.device)
    if loss_type == "luspo":
        return mask, num_rows
    return mask, mask.sum()  # dapo, cispo, vespo


class GRPOObjective:
    """The policy loss (+ beta * k3 KL when the KL is in the loss) on a minibatch of experience.

    Args:
        epsilon: Lower clip range (and the upper one when `epsilon_high` is None).
        epsilon_high: Upper clip range (DAPO's clip-higher); for `cispo` the cap of the ratio.
        beta: Weight of the k3 KL to the reference inside the loss; 0 when the KL is elsewhere or absent.
        loss_type: One of `LOSS_TYPES` (module docstring).
        importance_sampling_level: `token` or `sequence` (GSPO).
        max_completion_length: `dr_grpo`'s constant (`generation.max_new_tokens`).
        sapo_temperatures: SAPO's (tau for A > 0, tau for A <= 0).
        vespo_shape: VESPO's (k_pos, lambda_pos, k_neg, lambda_neg).
        use_bias_correction_kl: Multiply the KL term by the ratio r (with its gradient), which makes the KL
            gradient the unbiased reverse-KL gradient off-policy (DeepSeek-V3.2, 2025; TRL's default).
        correction: The rollout correction taken in this update's forward (`CorrectionInUpdate`), or None.
    """

    def __init__(self, *, epsilon: float, epsilon_high: float | None = None, beta: float = 0.0,
                 loss_type: str = "dapo", importance_sampling_level: str = "token",
                 max_completion_length: int | None = None, sapo_temperatures: tuple = (1.0, 1.05),
                 vespo_shape: tuple = (2.0, 3.0, 3.0, 2.0), use_bias_correction_kl: bool = False,
                 correction: CorrectionInUpdate | None = None) -> None:
        if loss_type not in LOSS_TYPES:
            raise ValueError(f"unknown loss_type {loss_type!r}, expected one of {LOSS_TYPES}")
        if loss_type == "dr_grpo" and not max_completion_length:
            raise ValueError("dr_grpo needs max_completion_length, its normalising constant")
        self.epsilon = epsilon
        self.epsilon_high = epsilon if epsilon_high is None else epsilon_high
        self.beta = beta
        self.loss_type = loss_type
        self.level = importance_sampling_level
        self.max_completion_length = max_completion_length
        self.sapo_temperatures = sapo_temperatures
        self.vespo_shape = vespo_shape
        self.use_bias_correction_kl = use_bias_correction_kl
        self.correction = correction

    @staticmethod
    def loss_mask(batch: dict[str, Tensor]) -> Tensor:
        """(B, T) the tokens that count: `loss_mask` (dropped rows 0) when present, else `action_mask`."""
        return (batch["loss_mask"] if "loss_mask" in batch else batch["action_mask"]).float()

    def count_units(self, batch: dict[str, Tensor]) -> Tensor:
        return aggregation_weights(self.loss_mask(batch), self.loss_type, self.max_completion_length)[1]

    def __call__(self, model: nn.Module, batch: dict[str, Tensor]) -> LossOutput:
        mask = self.loss_mask(batch)  # (B, T)
        logps = response_logps(model, batch)  # (B, T)
        losses, clipped, ratio = policy_loss(
            logps, old_or_current_logps(batch, logps), batch["advantages"], mask, loss_type=self.loss_type,
            epsilon=self.epsilon, epsilon_high=self.epsilon_high, level=self.level,
            sapo_temperatures=self.sapo_temperatures, vespo_shape=self.vespo_shape)  # (B, T) each
        # Stale experience (the asynchronous engine) or the rollout correction; w >= 0.
        importance = self.correction.weights(batch, logps) if self.correction else batch.get("importance_weights")
        if importance is not None:
            losses = importance * losses
        weights, count = aggregation_weights(mask, self.loss_type, self.max_completion_length)  # (B, T), ()
        stats = {"clip_fraction": (clipped * weights).sum()}
        if self.beta > 0:  # beta 0: the batch has no reference log-probs, and the term would be 0
            kl = kl_estimate(logps, batch["ref_logps"], "k3")  # (B, T)
            if self.use_bias_correction_kl:
                kl = kl * ratio  # (B, T); a (B, 1) sequence ratio broadcasts
            losses = losses + self.beta * kl
            stats["kl/ref"] = (kl.detach() * weights).sum()
        stats["loss"] = (losses.detach() * weights).sum()
        return LossOutput(total=(losses * weights).sum(), count=count, stats=stats)
