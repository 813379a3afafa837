"""Direct preference optimisation and its variants, on chosen/rejected pairs.

With policy log-ratios  h = (log pi(y_w|x) - log ref(y_w|x)) - (log pi(y_l|x) - log ref(y_l|x)):

- `sigmoid` (Rafailov et al. 2023, eq. 7), with label smoothing eps (conservative DPO,
  Mitchell 2023):  -(1 - eps) log sigmoid(beta h) - eps log sigmoid(-beta h)
- `ipo` (Azar et al. 2023, eq. 17):  (h - 1 / (2 beta))^2, on summed sequence log-probs as in
  the paper (TRL averages them per token instead).
- `simpo` (Meng et al. 2024, eq. 6): reference-free and length-normalised,
  -log sigmoid(beta (avg log pi(y_w|x) - avg log pi(y_l|x)) - gamma)

`rpo_alpha` adds the length-normalised negative log-likelihood of the chosen response to any of
these (DPO+NLL of Pang et al. 2024, "Iterative Reasoning Preference Optimization", section 2; TRL's
`rpo_alpha`):  loss + alpha * (-log pi(y_w|x) / |y_w|). The pairwise losses only move the
difference between chosen and rejected, so both log-probs can fall together; the NLL term keeps the
chosen answer likely, which is what raises greedy accuracy on answers that can be checked.

`reference_free` replaces the reference log-probs with 0. Chosen and rejected sequences go through the
model in one forward pass: packed padding-free into one row of whole sequences (`pack_preference`, the
default) or stacked and right-padded (`pad_preference`); `preference_logps` reads either.

Logged metrics: `loss`, `rewards/chosen`, `rewards/rejected` (beta times the log-ratio),
`rewards/accuracies`, `rewards/margins`, `logps/chosen`, `logps/rejected`, `nll_loss` (the chosen
response's per-token NLL, logged whether or not `rpo_alpha` adds it to the loss).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from trainer.algorithms.common import LossOutput, packed_inputs, packed_sequence_logps, scored_logits, sequence_logps


def sigmoid_preference_loss(chosen_logratios: Tensor, rejected_logratios: Tensor, *, beta: float,
                            label_smoothing: float = 0.0) -> Tensor:
    """DPO loss per pair. Inputs (B,) policy-minus-reference log-ratios; returns (B,)."""
    margins = beta * (chosen_logratios - rejected_logratios)  # (B,)
    return -(1 - label_smoothing) * F.logsigmoid(margins) - label_smoothing * F.logsigmoid(-margins)


def ipo_loss(chosen_logratios: Tensor, rejected_logratios: Tensor, *, beta: float) -> Tensor:
    """IPO loss per pair (Azar et al. 2023, eq. 17). Inputs (B,); returns (B,)."""
    return (chosen_logratios - rejected_logratios - 1 / (2 * beta)) ** 2


def simpo_loss(chosen_avg_logps: Tensor, rejected_avg_logps: Tensor, *, beta: float, gamma: float) -> Tensor:
    """SimPO loss per pair (Meng et al. 2024, eq. 6). Inputs (B,) per-token mean log-probs; returns (B,)."""
    return -F.logsigmoid(beta * (chosen_avg_logps - rejected_avg_logps) - gamma)


def chosen_nll_loss(chosen_logps: Tensor, chosen_num_tokens: Tensor) -> Tensor:
    """Per-token NLL of each chosen response (the NLL term of DPO+NLL, Pang et al. 2024, section 2).

    Args:
        chosen_logps: (B,) summed log-probs of the chosen responses' tokens.
        chosen_num_tokens: (B,) number of those tokens; clamped to at least 1.

    Returns:
        (B,) -chosen_logps / chosen_num_tokens.
    """
    return -chosen_logps / chosen_num_tokens.clamp(min=1)


class DPOObjective:
    """Forward pass and loss of one preference micro-batch.

    Args:
        beta: beta of the DPO paper (> 0).
        loss_type: `sigmoid`, `ipo` or `simpo`.
        label_smoothing: Conservative-DPO eps (sigmoid only).
        simpo_gamma: SimPO's target margin gamma.
        rpo_alpha: Weight of the chosen response's NLL added to the loss (alpha of DPO+NLL); None adds none.
        ref_model: Frozen reference; None when reference log-probs come with the batch
            (`ref_logps`, precomputed) or when the loss needs none (reference-free, SimPO).
    """

    def __init__(self, *, beta: float, loss_type: str = "sigmoid", label_smoothing: float = 0.0,
                 simpo_gamma: float = 0.5, rpo_alpha: float | None = None,
                 ref_model: nn.Module | None = None) -> None:
        self.beta = beta
        self.loss_type = loss_type
        self.label_smoothing = label_smoothing
        self.simpo_gamma = simpo_gamma
        self.rpo_alpha = rpo_alpha
        self.ref_model = ref_model

    @property
    def needs_reference(self) -> bool:
        return self.loss_type != "simpo"

    def count_units(self, batch: dict[str, Tensor]) -> Tensor:
        return torch.tensor(float(num_sequences(batch) // 2))

    def reference_logps(self, batch: dict[str, Tensor]) -> Tensor:
        """(2B,) reference log-probs: precomputed, from the reference model, or 0 (reference-free)."""
        if "ref_logps" in batch:
            return batch["ref_logps"]
        if self.ref_model is None or not self.needs_reference:
            return torch.zeros(num_sequences(batch), device=batch["input_ids"].device)
        with torch.no_grad():
            return preference_logps(self.ref_model, batch)[0]

    def __call__(self, model: nn.Module, batch: dict[str, Tensor]) -> LossOutput:
        # The reference runs first: its forward's transient memory then never adds to the policy's saved activations.
        reference = self.reference_logps(batch) if self.needs_reference else None  # (2B,)
        logps, num_tokens = preference_logps(model, batch)  # (2B,), (2B,)
        chosen_logps, rejected_logps = logps.chunk(2)  # (B,) each
        chosen_tokens, rejected_tokens = num_tokens.clamp(min=1).chunk(2)  # (B,) each
        if self.loss_type == "simpo":
            chosen_rewards = self.beta * chosen_logps / chosen_tokens
            rejected_rewards = self.beta * rejected_logps / rejected_tokens
            losses = simpo_loss(chosen_logps / chosen_tokens, rejected_logps / rejected_tokens,
                                beta=self.beta, gamma=self.simpo_gamma)
        else:
            ref_chosen, ref_rejected = reference.chunk(2)
            chosen_logratios, rejected_logratios = chosen_logps - ref_chosen, rejected_logps - ref_rejected
            chosen_rewards, rejected_rewards = self.beta * chosen_logratios, self.beta * rejected_logratios
            if self.loss_type == "ipo":
                losses = ipo_loss(chosen_logratios, rejected_logratios, beta=self.beta)
            else:
                losses = sigmoid_preference_loss(chosen_logratios, rejected_logratios, beta=self.beta,
                                                 label_smoothing=self.label_smoothing)
        nll = chosen_nll_loss(chosen_logps, chosen_tokens)  # (B,)
        if self.rpo_alpha is not None:
            losses = losses + self.rpo_alpha * nll  # (B,)
        chosen_rewards, rejected_rewards = chosen_rewards.detach(), rejected_rewards.detach()
        stats = {
            "loss": losses.detach().sum(),
            "rewards/chosen": chosen_rewards.sum(),
            "rewards/rejected": rejected_rewards.sum(),
            "rewards/accuracies": (chosen_rewards > rejected_rewards).float().sum(),
            "rewards/margins": (chosen_rewards - rejected_rewards).sum(),
            "logps/chosen": chosen_logps.detach().sum(),
            "logps/rejected": rejected_logps.detach().sum(),
            "nll_loss": nll.detach().sum(),
        }
        return LossOutput(total=losses.sum(), count=self.count_units(batch), stats=stats)


def preference_logps(model: nn.Module, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
    """Summed log-probs and token counts of a preference batch's 2B sequences, packed or padded.

    Args:
        model: A causal LM.
        batch: From `pack_preference` (input_ids, position_ids, sequence_ids, labels: (1, N), cu_seq_lens) or
            `pad_preference` (input_ids, attention_mask, labels: (2B, T)).

    Returns:
        (2B,) log-prob sums and (2B,) token counts: chosen 0..B-1, then rejected B..2B-1.
    """
    if "sequence_ids" not in batch:
        inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
        return sequence_logps(*scored_logits(model, inputs, batch["labels"]))
    logits, labels = scored_logits(model, packed_inputs(batch), batch["labels"])  # (1, N', V), (1, N'): prompt-only head cut
    sequence_ids = batch["sequence_ids"][:, -labels.shape[1]:]  # (R, L'), aligned with the kept labels
    return packed_sequence_logps(logits, labels, sequence_ids, num_sequences=num_sequences(batch))


def num_sequences(batch: dict[str, Tensor]) -> int:
    """2B, the chosen and rejected sequences of a packed or padded preference batch."""
    return batch["last_positions"].shape[0] if "last_positions" in batch else batch["input_ids"].shape[0]
