"""Direct preference optimisation and its variants, on chosen/rejected pairs.

Notation, per pair: c and r are the chosen and rejected log-ratios log pi(y|x) - log ref(y|x)
(summed over the response's tokens), h = c - r, and beta the strength of the pull towards the
reference. Each loss is one pure function, (B,) in and (B,) out; `PAIR_LOSSES` names them (TRL's
`loss_type` names):

| loss_type | per-pair loss | source |
|---|---|---|
| `sigmoid` | -(1 - eps) log s(beta h) - eps log s(-beta h) | Rafailov et al. 2023, eq. 7; eps: conservative DPO (Mitchell 2023) |
| `hinge` | max(0, 1 - beta h) | SLiC, Zhao et al. 2023, eq. 3 |
| `ipo` | (h - 1 / (2 beta))^2, on summed log-probs (TRL averages per token) | Azar et al. 2023, eq. 17 |
| `exo_pair` | KL(softmax(beta [c, r]) || [1 - eps, eps]) | EXO, Ji et al. 2024, eq. 16 (eps > 0) |
| `nca_pair` | -log s(beta c) - 1/2 log s(-beta c) - 1/2 log s(-beta r) | NCA, Chen et al. 2024, eq. 9 |
| `robust` | ((1 - eps)(-log s(beta h)) - eps (-log s(-beta h))) / (1 - 2 eps) | rDPO, Chowdhury et al. 2024, eq. 8 |
| `bco_pair` | -log s(beta c) - log s(-beta r) | BCO, Jung et al. 2024, eq. 5 (TRL's pair form, no running delta) |
| `sppo_hard` | (c - 1 / (2 beta))^2 + (r + 1 / (2 beta))^2 | SPPO, Wu et al. 2024, eq. 4.7 (hard labels) |
| `aot` | sigmoid loss on sort(log pi_w - log pi_l) - sort(ref's), over the batch | AOT, Melnyk et al. 2024, eq. 11 |
| `aot_unpaired` | sigmoid loss on sort(c) - sort(r), over the batch | AOT, Melnyk et al. 2024 (unpaired) |
| `apo_zero` | 1 - s(beta c) + s(beta r) | APO, D'Oosterlinck et al. 2024, eq. 7 |
| `apo_down` | s(beta c) + 1 - s(beta h) | APO, D'Oosterlinck et al. 2024, eq. 8 |
| `discopop` | (1 - m)(-log s(beta h)) + m exp(-beta h), m = s(beta h / tau) | DiscoPOP, Lu et al. 2024, eq. 5 |
| `sigmoid_norm` | -log s(beta (c / abs(y_w) - r / abs(y_l))) | length-normalised DPO (TRL) |
| `sft` | -log pi(y_w|x) / abs(y_w) | the chosen answer's per-token NLL |
| `simpo` | -log s(beta (log pi(y_w|x) / abs(y_w) - log pi(y_l|x) / abs(y_l)) - gamma), reference-free | Meng et al. 2024, eq. 6 |

(s is the logistic sigmoid, eps `label_smoothing`, abs(y) a response's token count.) `aot` and
`aot_unpaired` sort within the micro-batch, so their value depends on how a batch is split into
micro-batches (as in TRL). `loss_type` may be a list: the losses are added with `loss_weights`
(default 1 each), TRL's form of MPO-style combinations, e.g. `[sigmoid, bco_pair, sft]`.

`rpo_alpha` adds the length-normalised negative log-likelihood of the chosen response to any of
these (DPO+NLL of Pang et al. 2024, "Iterative Reasoning Preference Optimization", section 2; TRL's
`rpo_alpha`):  loss + alpha * (-log pi(y_w|x) / abs(y_w)). The pairwise losses only move the
difference between chosen and rejected, so both log-probs can fall together; the NLL term keeps the
chosen answer likely, which is what raises greedy accuracy on answers that can be checked.

`reference_free` replaces the reference log-probs with 0. Chosen and rejected sequences go through the
model in one forward pass: packed padding-free into one row of whole sequences (`pack_preference`) or
stacked and right-padded (`pad_preference`); `preference_logps` reads either. With `share_prompts`, a padded
batch runs each pair's prompt once and both answers on top of its keys and values
(`trainer.modeling.shared_prompts`; the log-probs equal the plain forward's up to rounding); by default
(`dpo.packing` and `dpo.share_prompts` on) each micro-batch takes whichever form computes fewer tokens
(`pack_or_share_preference`).

Logged metrics: `loss`, `rewards/chosen`, `rewards/rejected` (beta times the log-ratio; SimPO alone:
beta times the per-token mean log-prob), `rewards/accuracies`, `rewards/margins`, `logps/chosen`,
`logps/rejected`, `nll_loss` (the chosen response's per-token NLL, logged whether or not `rpo_alpha`
adds it to the loss).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from trainer.algorithms.common import (
    LossOutput,
    first_scored_position,
    packed_inputs,
    packed_sequence_logps,
    scored_logits,
    sequence_logps,
)
from trainer.modeling.concurrent_forwards import can_run_concurrently, run_concurrently
from trainer.modeling.shared_prompts import shared_prompt_logits, shares_prompts


def sigmoid_preference_loss(chosen_logratios: Tensor, rejected_logratios: Tensor, *, beta: float,
                            label_smoothing: float = 0.0) -> Tensor:
    """DPO loss per pair. Inputs (B,) policy-minus-reference log-ratios; returns (B,)."""
    margins = beta * (chosen_logratios - rejected_logratios)  # (B,)
    return -(1 - label_smoothing) * F.logsigmoid(margins) - label_smoothing * F.logsigmoid(-margins)


def hinge_loss(chosen_logratios: Tensor, rejected_logratios: Tensor, *, beta: float) -> Tensor:
    """SLiC's hinge loss per pair (Zhao et al. 2023, eq. 3), margin 1 / beta in log-ratio units. (B,) -> (B,)."""
    return torch.relu(1 - beta * (chosen_logratios - rejected_logratios))


def ipo_loss(chosen_logratios: Tensor, rejected_logratios: Tensor, *, beta: float) -> Tensor:
    """IPO loss per pair (Azar et al. 2023, eq. 17). Inputs (B,); returns (B,)."""
    return (chosen_logratios - rejected_logratios - 1 / (2 * beta)) ** 2


def exo_pair_loss(chosen_logratios: Tensor, rejected_logratios: Tensor, *, beta: float,
                  label_smoothing: float) -> Tensor:
    """EXO (Ji et al. 2024, eq. 16, K = 2): KL(q || p) with q = softmax(beta [c, r]), p = [1 - eps, eps]. (B,) -> (B,).

    Needs eps > 0 (log eps); the paper uses 1e-3.
    """
    margins = beta * (chosen_logratios - rejected_logratios)  # (B,)
    log_chosen, log_rejected = F.logsigmoid(margins), F.logsigmoid(-margins)  # log q_w, log q_l
    return (log_chosen.exp() * (log_chosen - math.log1p(-label_smoothing))
            + log_rejected.exp() * (log_rejected - math.log(label_smoothing)))


def nca_pair_loss(chosen_logratios: Tensor, rejected_logratios: Tensor, *, beta: float) -> Tensor:
    """NCA (Chen et al. 2024, "Noise Contrastive Alignment", eq. 9) per pair. (B,) -> (B,)."""
    chosen, rejected = beta * chosen_logratios, beta * rejected_logratios
    return -F.logsigmoid(chosen) - 0.5 * F.logsigmoid(-chosen) - 0.5 * F.logsigmoid(-rejected)


def robust_loss(chosen_logratios: Tensor, rejected_logratios: Tensor, *, beta: float, label_smoothing: float) -> Tensor:
    """Robust DPO (Chowdhury et al. 2024, eq. 8): unbiased under a flip rate eps < 1/2. (B,) -> (B,)."""
    margins = beta * (chosen_logratios - rejected_logratios)  # (B,)
    clean = -(1 - label_smoothing) * F.logsigmoid(margins)
    flipped = -label_smoothing * F.logsigmoid(-margins)
    return (clean - flipped) / (1 - 2 * label_smoothing)


def bco_pair_loss(chosen_logratios: Tensor, rejected_logratios: Tensor, *, beta: float) -> Tensor:
    """BCO on pairs (Jung et al. 2024, eq. 5, as TRL's `bco_pair`: without the running reward shift delta). (B,) -> (B,)."""
    return -F.logsigmoid(beta * chosen_logratios) - F.logsigmoid(-beta * rejected_logratios)


def sppo_hard_loss(chosen_logratios: Tensor, rejected_logratios: Tensor, *, beta: float) -> Tensor:
    """SPPO (Wu et al. 2024, eq. 4.7) with hard win probabilities 1 and 0. (B,) -> (B,)."""
    return (chosen_logratios - 0.5 / beta) ** 2 + (rejected_logratios + 0.5 / beta) ** 2


def aot_loss(policy_margins: Tensor, reference_margins: Tensor, *, beta: float, label_smoothing: float = 0.0) -> Tensor:
    """AOT (Melnyk et al. 2024, eq. 11): the sigmoid loss between the sorted batch of policy and reference margins.

    Args:
        policy_margins: (B,) log pi(y_w|x) - log pi(y_l|x) (`aot`), or the chosen log-ratios (`aot_unpaired`).
        reference_margins: (B,) the reference's margins (`aot`), or the rejected log-ratios (`aot_unpaired`).

    Returns:
        (B,): one loss per rank of the sorted margins (first-order stochastic dominance over the batch).
    """
    delta = torch.sort(policy_margins).values - torch.sort(reference_margins).values  # (B,)
    return -(1 - label_smoothing) * F.logsigmoid(beta * delta) - label_smoothing * F.logsigmoid(-beta * delta)


def apo_zero_loss(chosen_logratios: Tensor, rejected_logratios: Tensor, *, beta: float) -> Tensor:
    """APO-zero (D'Oosterlinck et al. 2024, eq. 7): raise the chosen answer, lower the rejected one. (B,) -> (B,)."""
    return 1 - torch.sigmoid(beta * chosen_logratios) + torch.sigmoid(beta * rejected_logratios)


def apo_down_loss(chosen_logratios: Tensor, rejected_logratios: Tensor, *, beta: float) -> Tensor:
    """APO-down (D'Oosterlinck et al. 2024, eq. 8): lower both, the rejected one more. (B,) -> (B,)."""
    return torch.sigmoid(beta * chosen_logratios) + 1 - torch.sigmoid(beta * (chosen_logratios - rejected_logratios))


def discopop_loss(chosen_logratios: Tensor, rejected_logratios: Tensor, *, beta: float, tau: float) -> Tensor:
    """DiscoPOP (Lu et al. 2024, eq. 5): logistic and exponential losses mixed by sigmoid(beta h / tau). (B,) -> (B,)."""
    logits = beta * (chosen_logratios - rejected_logratios)  # (B,)
    mix = torch.sigmoid(logits / tau)
    return (1 - mix) * -F.logsigmoid(logits) + mix * torch.exp(-logits)


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


@dataclass(frozen=True, slots=True)
class PairLogps:
    """What every pair loss reads, (B,) each: policy and reference log-prob sums and token counts."""

    chosen: Tensor
    rejected: Tensor
    ref_chosen: Tensor
    ref_rejected: Tensor
    chosen_tokens: Tensor
    rejected_tokens: Tensor

    @property
    def chosen_logratios(self) -> Tensor:
        return self.chosen - self.ref_chosen

    @property
    def rejected_logratios(self) -> Tensor:
        return self.rejected - self.ref_rejected


def pair_loss(name: str, pair: PairLogps, *, beta: float, label_smoothing: float = 0.0, simpo_gamma: float = 0.5,
              discopop_tau: float = 0.05) -> Tensor:
    """The (B,) losses of `loss_type` `name` (the module docstring's table)."""
    c, r = pair.chosen_logratios, pair.rejected_logratios
    if name in PAIR_LOSSES:
        return PAIR_LOSSES[name](c, r, beta=beta)
    if name == "sigmoid":
        return sigmoid_preference_loss(c, r, beta=beta, label_smoothing=label_smoothing)
    if name == "exo_pair":
        return exo_pair_loss(c, r, beta=beta, label_smoothing=label_smoothing)
    if name == "robust":
        return robust_loss(c, r, beta=beta, label_smoothing=label_smoothing)
    if name == "aot":
        return aot_loss(pair.chosen - pair.rejected, pair.ref_chosen - pair.ref_rejected, beta=beta,
                        label_smoothing=label_smoothing)
    if name == "aot_unpaired":
        return aot_loss(c, r, beta=beta, label_smoothing=label_smoothing)
    if name == "discopop":
        return discopop_loss(c, r, beta=beta, tau=discopop_tau)
    if name == "sigmoid_norm":
        return sigmoid_preference_loss(c / pair.chosen_tokens, r / pair.rejected_tokens, beta=beta)
    if name == "sft":
        return chosen_nll_loss(pair.chosen, pair.chosen_tokens)
    if name == "simpo":
        return simpo_loss(pair.chosen / pair.chosen_tokens, pair.rejected / pair.rejected_tokens, beta=beta,
                          gamma=simpo_gamma)
    raise ValueError(f"unknown DPO loss_type {name!r}, expected one of {LOSS_TYPES}")


# The losses that read only (c, r, beta); `pair_loss` calls the others with their own arguments.
PAIR_LOSSES = {"hinge": hinge_loss, "ipo": ipo_loss, "nca_pair": nca_pair_loss, "bco_pair": bco_pair_loss,
               "sppo_hard": sppo_hard_loss, "apo_zero": apo_zero_loss, "apo_down": apo_down_loss}
LOSS_TYPES = ("sigmoid", "hinge", "ipo", "exo_pair", "nca_pair", "robust", "bco_pair", "sppo_hard", "aot",
              "aot_unpaired", "apo_zero", "apo_down", "discopop", "sigmoid_norm", "sft", "simpo")
REFERENCE_FREE_LOSSES = ("simpo", "sft")  # read no reference log-probs
SMOOTHED_LOSSES = ("sigmoid", "robust", "exo_pair", "aot", "aot_unpaired")  # read label_smoothing


class DPOObjective:
    """Forward pass and loss of one preference micro-batch.

    Args:
        beta: beta of the DPO paper (> 0).
        loss_type: One of `LOSS_TYPES`, or a sequence of them whose losses are added.
        loss_weights: Weight of each loss of a `loss_type` sequence; None weighs each 1.
        label_smoothing: eps of the losses in `SMOOTHED_LOSSES`.
        simpo_gamma: SimPO's target margin gamma.
        discopop_tau: DiscoPOP's temperature tau.
        rpo_alpha: Weight of the chosen response's NLL added to the loss (alpha of DPO+NLL); None adds none.
        ref_model: Frozen reference; None when reference log-probs come with the batch
            (`ref_logps`, precomputed) or when the losses need none (reference-free, SimPO, SFT).
        share_prompts: Run a padded batch's shared prompts once (`preference_logps`), in both models.
    """

    def __init__(self, *, beta: float, loss_type: str | Sequence[str] = "sigmoid",
                 loss_weights: Sequence[float] | None = None, label_smoothing: float = 0.0, simpo_gamma: float = 0.5,
                 discopop_tau: float = 0.05, rpo_alpha: float | None = None, ref_model: nn.Module | None = None,
                 share_prompts: bool = False) -> None:
        self.beta = beta
        self.loss_types = (loss_type,) if isinstance(loss_type, str) else tuple(loss_type)
        self.loss_weights = tuple(loss_weights) if loss_weights is not None else (1.0,) * len(self.loss_types)
        if len(self.loss_weights) != len(self.loss_types):
            raise ValueError(f"{len(self.loss_weights)} loss_weights for {len(self.loss_types)} loss types")
        self.options = {"beta": beta, "label_smoothing": label_smoothing, "simpo_gamma": simpo_gamma,
                        "discopop_tau": discopop_tau}
        self.rpo_alpha = rpo_alpha
        self.ref_model = ref_model
        self.share_prompts = share_prompts

    @property
    def needs_reference(self) -> bool:
        return any(name not in REFERENCE_FREE_LOSSES for name in self.loss_types)

    def count_units(self, batch: dict[str, Tensor]) -> Tensor:
        return torch.tensor(float(num_sequences(batch) // 2))

    def reference_logps(self, batch: dict[str, Tensor]) -> Tensor:
        """(2B,) reference log-probs: precomputed, from the reference model, or 0 (reference-free)."""
        if "ref_logps" in batch:
            return batch["ref_logps"]
        if self.ref_model is None or not self.needs_reference:
            return torch.zeros(num_sequences(batch), device=batch["input_ids"].device)
        with torch.no_grad():
            return preference_logps(self.ref_model, batch, share_prompts=self.share_prompts)[0]

    def __call__(self, model: nn.Module, batch: dict[str, Tensor]) -> LossOutput:
        def policy() -> tuple[Tensor, Tensor]:
            return preference_logps(model, batch, share_prompts=self.share_prompts)  # (2B,), (2B,)

        live_reference = "ref_logps" not in batch and self.ref_model is not None and self.needs_reference
        if live_reference and can_run_concurrently(model, self.ref_model, device=batch["input_ids"].device):
            # CPU: the two forwards side by side, a thread each (trainer.modeling.concurrent_forwards).
            reference, (logps, num_tokens) = run_concurrently(lambda: self.reference_logps(batch), policy)
        else:
            # The reference first: its forward's transient memory then never adds to the policy's saved activations.
            reference = self.reference_logps(batch)  # (2B,)
            logps, num_tokens = policy()
        pair = PairLogps(*logps.chunk(2), *reference.chunk(2), *num_tokens.clamp(min=1).chunk(2))  # (B,) each
        losses = sum(weight * pair_loss(name, pair, **self.options)
                     for name, weight in zip(self.loss_types, self.loss_weights))  # (B,)
        nll = chosen_nll_loss(pair.chosen, pair.chosen_tokens)  # (B,)
        if self.rpo_alpha is not None:
            losses = losses + self.rpo_alpha * nll  # (B,)
        if self.needs_reference:
            chosen_rewards, rejected_rewards = self.beta * pair.chosen_logratios, self.beta * pair.rejected_logratios
        else:  # SimPO's implicit reward: beta times the per-token mean log-prob
            chosen_rewards = self.beta * pair.chosen / pair.chosen_tokens
            rejected_rewards = self.beta * pair.rejected / pair.rejected_tokens
        chosen_rewards, rejected_rewards = chosen_rewards.detach(), rejected_rewards.detach()
        stats = {
            "loss": losses.detach().sum(),
            "rewards/chosen": chosen_rewards.sum(),
            "rewards/rejected": rejected_rewards.sum(),
            "rewards/accuracies": (chosen_rewards > rejected_rewards).float().sum(),
            "rewards/margins": (chosen_rewards - rejected_rewards).sum(),
            "logps/chosen": pair.chosen.detach().sum(),
            "logps/rejected": pair.rejected.detach().sum(),
            "nll_loss": nll.detach().sum(),
        }
        return LossOutput(total=losses.sum(), count=self.count_units(batch), stats=stats)


def preference_logps(model: nn.Module, batch: dict[str, Tensor], share_prompts: bool = False) -> tuple[Tensor, Tensor]:
    """Summed log-probs and token counts of a preference batch's 2B sequences, packed or padded.

    Args:
        model: A causal LM.
        batch: From `pack_preference` (input_ids, position_ids, sequence_ids, labels: (1, N), cu_seq_lens) or
            `pad_preference` (input_ids, attention_mask, labels: (2B, T)).
        share_prompts: For a padded batch, run the columns before its first label once per distinct prompt
            (a pair's two rows share theirs) and each row's rest on top of their keys and values, where the model
            allows it (`shares_prompts`); the log-probs equal the plain forward's up to rounding.

    Returns:
        (2B,) log-prob sums and (2B,) token counts: chosen 0..B-1, then rejected B..2B-1.
    """
    if "sequence_ids" not in batch:
        inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
        labels = batch["labels"]  # (2B, T)
        start = first_scored_position(labels)
        if share_prompts and start > 0 and shares_prompts(model):
            logits = shared_prompt_logits(model, inputs, start)  # (2B, T - start, V); None: no prompt is shared
            if logits is not None:
                return sequence_logps(logits, labels[:, start:])
        return sequence_logps(*scored_logits(model, inputs, labels))
    logits, labels = scored_logits(model, packed_inputs(batch), batch["labels"])  # (1, N', V), (1, N'): prompt-only head cut
    sequence_ids = batch["sequence_ids"][:, -labels.shape[1]:]  # (R, L'), aligned with the kept labels
    return packed_sequence_logps(logits, labels, sequence_ids, num_sequences=num_sequences(batch))


def num_sequences(batch: dict[str, Tensor]) -> int:
    """2B, the chosen and rejected sequences of a packed or padded preference batch."""
    return batch["last_positions"].shape[0] if "last_positions" in batch else batch["input_ids"].shape[0]
