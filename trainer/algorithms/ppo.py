"""PPO for language models: KL-shaped rewards, GAE, clipped policy and value losses.

Rewards (Ziegler et al. 2019; Ouyang et al. 2022, eq. 2): every response token t gets
    r_t = -kl_coef * KL_t            (KL_t: per-token estimate of KL(pi || ref), `kl_estimate`)
and the last response token additionally gets the sequence score. The score is *not* added to
every token (the seed project did that, and it collapses training).

Advantages: GAE(gamma, lambda) over response tokens only (Schulman et al. 2016, eq. 16);
returns = advantages + values. Optionally whitened over the batch.

Policy loss (Schulman et al. 2017, eq. 7), per token: max(-A * ratio, -A * clip(ratio, 1-eps, 1+eps)),
ratio = pi_theta / pi_old.
Value loss, per token: 0.5 * max((V - R)^2, (clip(V, V_old - c, V_old + c) - R)^2).

Stale experience (the asynchronous engine): responses sampled by an explorer holding older weights
pi_behav are learnt from with the decoupled PPO objective (Hilton, Cobbe and Schulman 2022, "Batch
size-invariance for policy optimization", arXiv:2110.00641): pi_old becomes the proximal policy
(the trainer's weights at the start of the step) and each token's clipped surrogate is multiplied
by the importance weight
    w_t = min(pi_old(a_t) / pi_behav(a_t), cap)
truncated as V-trace truncates rho (Espeholt et al. 2018, "IMPALA", eq. 1, rho-bar) and as
truncated importance sampling does for rollout/trainer mismatch (Yao et al. 2025). On-policy
(pi_behav = pi_old) w = 1 and the loss is the one above. The weight multiplies the policy term
only; regularisers (entropy bonus, GRPO's KL) are left as they are.

Logged metrics: `loss` (policy), `value_loss`, `kl/approx` (mean 0.5 (log ratio)^2 vs pi_old),
`clip_fraction`, `entropy`, `value_clip_fraction`.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from trainer.algorithms.common import LossOutput, masked_mean, token_logps
from trainer.algorithms.rollout_correction import CorrectionInUpdate
from trainer.modeling.shared_prompts import shared_prompt_logits, shares_prompts


def kl_estimate(logps: Tensor, ref_logps: Tensor, estimator: str = "k1") -> Tensor:
    """Per-token estimate of KL(pi || ref) from samples of pi (Schulman 2020, "Approximating KL").

    k1 = log pi - log ref (unbiased, high variance, can be negative);
    k3 = ratio - 1 - log ratio with ratio = ref / pi (unbiased, always >= 0).
    Inputs (B, T); returns (B, T).
    """
    log_ratio = logps - ref_logps  # (B, T)
    if estimator == "k1":
        return log_ratio
    if estimator == "k3":
        return torch.exp(-log_ratio) - 1 + log_ratio
    raise ValueError(f"unknown KL estimator {estimator!r}, expected 'k1' or 'k3'")


def shape_rewards(scores: Tensor, kl: Tensor, action_mask: Tensor, *, kl_coef: float,
                  reward_clip: float | None = None) -> Tensor:
    """Per-token rewards: -kl_coef * KL on every response token, plus the score on the last one.

    Args:
        scores: (B,) sequence scores (reward model or reward function).
        kl: (B, T) per-token KL estimates.
        action_mask: (B, T) 1 on response tokens.
        kl_coef: Weight of the KL penalty.
        reward_clip: Clip scores to [-reward_clip, reward_clip] first; None leaves them.

    Returns:
        (B, T) rewards, 0 outside the response.
    """
    if reward_clip is not None:
        scores = scores.clamp(-reward_clip, reward_clip)
    rewards = -kl_coef * kl * action_mask  # (B, T)
    positions = torch.arange(action_mask.shape[1], device=action_mask.device)  # (T,)
    last = (action_mask * positions).argmax(dim=1)  # (B,) index of the last response token
    rewards[torch.arange(len(scores)), last] += scores
    return rewards


def gae_advantages(rewards: Tensor, values: Tensor, action_mask: Tensor, *, gamma: float,
                   lam: float) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation over response tokens only.

    Masked positions neither contribute rewards nor bootstrap values: the value after the last
    response token is 0 and prompt/padding tokens are skipped.

    Args:
        rewards, values, action_mask: (B, T).
        gamma: Discount.
        lam: GAE lambda.

    Returns:
        advantages (B, T) and returns = advantages + values (B, T), 0 outside the response.
    """
    mask = action_mask.float()
    advantages = torch.zeros_like(rewards)
    next_value = torch.zeros_like(rewards[:, 0])  # (B,)
    running = torch.zeros_like(rewards[:, 0])  # (B,)
    for t in reversed(range(rewards.shape[1])):
        delta = rewards[:, t] + gamma * next_value - values[:, t]  # (B,)
        updated = delta + gamma * lam * running
        running = torch.where(mask[:, t] > 0, updated, running)
        next_value = torch.where(mask[:, t] > 0, values[:, t], next_value)
        advantages[:, t] = running * mask[:, t]
    return advantages, (advantages + values) * mask


def whiten(values: Tensor, mask: Tensor, eps: float = 1e-8) -> Tensor:
    """Zero-mean, unit-variance over the masked entries; 0 elsewhere."""
    mean = masked_mean(values, mask)
    variance = masked_mean((values - mean) ** 2, mask)
    return (values - mean) * torch.rsqrt(variance + eps) * mask


def truncated_importance_weights(old_logps: Tensor, behaviour_logps: Tensor, *, cap: float) -> Tensor:
    """Per-token w = min(pi_old / pi_behav, cap), constants for the gradient. Inputs (B, T); returns (B, T).

    Masked positions (both log-probs 0) get weight 1. exp overflowing to inf is truncated to `cap`.
    """
    return torch.exp((old_logps - behaviour_logps).detach()).clamp(max=cap)  # (B, T)


def clipped_surrogate(ratio: Tensor, advantages: Tensor, *, low: float, high: float) -> tuple[Tensor, Tensor]:
    """PPO's clipped surrogate to minimise, -min(r A, clip(r, 1 - low, 1 + high) A), and where the clip bound.

    `high` above `low` is DAPO's clip-higher (Yu et al. 2025, section 3.1). `ratio` broadcasts
    against `advantages` (a (B, 1) sequence ratio, GSPO). Returns the losses and 1.0 where the
    clipped branch was the larger loss (the update was cut off), both of the broadcast shape.
    """
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1 - low, 1 + high)
    return torch.maximum(unclipped, clipped), (clipped > unclipped).float()


def clipped_policy_loss(logps: Tensor, old_logps: Tensor, advantages: Tensor, *, cliprange: float,
                        importance_weights: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Per-token PPO clipped surrogate (to minimise) and whether each token was clipped. (B, T) each.

    With `importance_weights` (B, T) (see `truncated_importance_weights`) this is the decoupled
    objective: w * max(-A * ratio, -A * clip(ratio, 1-eps, 1+eps)), ratio against the proximal `old_logps`.
    """
    ratio = torch.exp(logps - old_logps)  # (B, T)
    losses, clipped = clipped_surrogate(ratio, advantages, low=cliprange, high=cliprange)  # (B, T) each
    if importance_weights is not None:
        losses = importance_weights * losses  # w >= 0, so it commutes with the max
    return losses, clipped


def clipped_value_loss(values: Tensor, old_values: Tensor, returns: Tensor, *,
                       cliprange_value: float) -> tuple[Tensor, Tensor]:
    """Per-token clipped value loss and whether the clipped branch was taken. (B, T) each."""
    clipped_values = old_values + (values - old_values).clamp(-cliprange_value, cliprange_value)
    unclipped_loss = (values - returns) ** 2
    clipped_loss = (clipped_values - returns) ** 2
    return 0.5 * torch.maximum(unclipped_loss, clipped_loss), (clipped_loss > unclipped_loss).float()


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Per-position entropy of the softmax. (B, T, V) -> (B, T)."""
    logps = torch.log_softmax(logits.float(), dim=-1)
    return -(logps.exp() * logps).sum(-1)


def first_response_column(batch: dict[str, Tensor]) -> int:
    """The first column any row's `action_mask` marks (prompts are left-padded, so responses start together).

    0 when the batch has no `action_mask` or no response token, which keeps every position.
    """
    if "action_mask" not in batch:
        return 0
    columns = batch["action_mask"].bool().any(0).nonzero()  # (n, 1)
    return int(columns[0]) if len(columns) else 0


def response_logps(model: nn.Module, batch: dict[str, Tensor], *, with_entropy: bool = False):
    """Log-probs of each token given its prefix, aligned so position t scores token t. (B, T).

    Position 0 has no prefix and gets 0; callers multiply by the action mask anyway. Logits are
    computed only from the column before the first response token on (`logits_to_keep`): the
    prompt's own tokens are never scored, and with a large vocabulary their (B, P, V) logits would be
    the biggest tensor of the step. Positions before that column hold 0 (log-probs and entropy). Rows that
    share a prompt share its forward (`trainer.modeling.shared_prompts`), where the model allows it.
    """
    start = max(first_response_column(batch) - 1, 0)  # the logit at start scores token start + 1
    logits = shared_prompt_logits(model, batch, start) if start > 0 and shares_prompts(model) else None
    if logits is None:
        keep = {"logits_to_keep": batch["input_ids"].shape[1] - start} if start > 0 else {}
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                       position_ids=batch.get("position_ids"), use_cache=False, **keep).logits  # (B, T - start, V)
    # Every token of a sampled sequence is its own label: the one log-prob gather of the project.
    picked, _ = token_logps(logits, batch["input_ids"][:, start:])  # (B, T-start-1) scores tokens start+1..T-1
    logps = torch.nn.functional.pad(picked, (start + 1, 0))  # (B, T)
    if not with_entropy:
        return logps
    return logps, torch.nn.functional.pad(entropy_from_logits(logits[:, :-1].float()), (start + 1, 0))


def old_or_current_logps(batch: dict[str, Tensor], logps: Tensor) -> Tensor:
    """The batch's `old_logps`, or, when the rollout left them out because the update is exactly on-policy
    (its only optimizer step runs on the weights that sampled it), the current log-probs as constants.

    Then ratio = exp(logps - logps.detach()) is 1 with the gradient of logps, which is what the explicit
    old-log-prob forward gives on the same weights, without that forward. (B, T).
    """
    return batch["old_logps"] if "old_logps" in batch else logps.detach()


def response_values(critic: nn.Module, batch: dict[str, Tensor]) -> Tensor:
    """Value of the state *before* each token, aligned like `response_logps`. (B, T).

    The critic's output at position t-1 has read tokens up to t-1: the state in which token t
    was chosen.
    """
    values = critic(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                    position_ids=batch.get("position_ids")).float()  # (B, T)
    return torch.nn.functional.pad(values[:, :-1], (1, 0))


class AdaptiveKLController:
    """Moves kl_coef so the observed KL tracks a target (Ziegler et al. 2019, section 2.2)."""

    def __init__(self, kl_coef: float, target_kl: float | None, horizon: int) -> None:
        self.value = kl_coef
        self.target_kl = target_kl
        self.horizon = horizon

    def update(self, observed_kl: float, num_samples: int) -> None:
        if self.target_kl is None:
            return
        error = max(-0.2, min(0.2, observed_kl / self.target_kl - 1))
        self.value *= 1 + error * num_samples / self.horizon


class PPOActorObjective:
    """Clipped policy loss (+ optional entropy bonus and pretraining loss) on a minibatch of experience.

    Units are response tokens: the step's loss is the mean over all response tokens of the global
    minibatch. With a pretraining batch (`ptx_input_ids`, `ptx_labels`) the mean next-token loss on
    it, times `ptx_coef`, is added.
    """

    def __init__(self, *, cliprange: float, entropy_coef: float = 0.0, ptx_coef: float = 0.0,
                 correction: CorrectionInUpdate | None = None) -> None:
        self.cliprange = cliprange
        self.entropy_coef = entropy_coef
        self.ptx_coef = ptx_coef
        self.correction = correction  # the rollout correction taken in this update's forward, or None

    def count_units(self, batch: dict[str, Tensor]) -> Tensor:
        return batch["action_mask"].sum().float()

    def __call__(self, model: nn.Module, batch: dict[str, Tensor]) -> LossOutput:
        mask = batch["action_mask"].float()
        logps, entropy = response_logps(model, batch, with_entropy=True)  # (B, T) each
        old_logps = old_or_current_logps(batch, logps)
        importance = self.correction.weights(batch, logps) if self.correction else batch.get("importance_weights")
        losses, clipped = clipped_policy_loss(logps, old_logps, batch["advantages"], cliprange=self.cliprange,
                                              importance_weights=importance)
        total = (losses * mask).sum() - self.entropy_coef * (entropy * mask).sum()
        log_ratio = (logps - old_logps).detach()
        stats = {
            "loss": (losses.detach() * mask).sum(),
            "clip_fraction": (clipped * mask).sum(),
            "kl/approx": (0.5 * log_ratio**2 * mask).sum(),
            "entropy": (entropy.detach() * mask).sum(),
        }
        if self.ptx_coef > 0 and "ptx_input_ids" in batch:
            from trainer.algorithms.sft import sft_token_loss

            ptx_logits = model(input_ids=batch["ptx_input_ids"], use_cache=False).logits
            ptx_sum, ptx_count = sft_token_loss(ptx_logits, batch["ptx_labels"])
            ptx_mean = ptx_sum / ptx_count.clamp(min=1)
            total = total + self.ptx_coef * ptx_mean * mask.sum()  # weighted like the tokens it rides with
            stats["ptx_loss"] = ptx_mean.detach() * mask.sum()
        return LossOutput(total=total, count=mask.sum(), stats=stats)


class PPOCriticObjective:
    """Clipped value loss, times `vf_coef`, over response tokens."""

    def __init__(self, *, cliprange_value: float, vf_coef: float) -> None:
        self.cliprange_value = cliprange_value
        self.vf_coef = vf_coef

    def count_units(self, batch: dict[str, Tensor]) -> Tensor:
        return batch["action_mask"].sum().float()

    def __call__(self, model: nn.Module, batch: dict[str, Tensor]) -> LossOutput:
        mask = batch["action_mask"].float()
        values = response_values(model, batch)  # (B, T)
        losses, clipped = clipped_value_loss(values, batch["values"], batch["returns"],
                                             cliprange_value=self.cliprange_value)
        stats = {"value_loss": (losses.detach() * mask).sum(), "value_clip_fraction": (clipped * mask).sum()}
        return LossOutput(total=self.vf_coef * (losses * mask).sum(), count=mask.sum(), stats=stats)
