"""KTO: alignment from unpaired feedback (Ethayarajh et al. 2024, "KTO: Model Alignment as Prospect
Theoretic Optimization").

Each row is a prompt x, a completion y and a label: desirable or undesirable. With the implied
reward r = log pi(y|x) - log ref(y|x) (summed over the completion's tokens) and the reference
point z0 (eq. 7-8):

    desirable:    lambda_D * (1 - sigmoid(beta (r - z0)))
    undesirable:  lambda_U * (1 - sigmoid(beta (z0 - r)))

z0 estimates KL(pi || ref) and carries no gradient: the batch's mismatched pairs (prompt x_i with
the completion of row i - 1, `trainer.data.collate.pad_unpaired`) are scored by the policy and the
reference, z0 = max(0, mean(log pi(y'|x) - log ref(y'|x))) over the micro-batch (section 4.1). With several
data-parallel ranks the micro-batch means are averaged over the ranks before the clamp, as TRL does, so every
rank uses the same z0, estimated from the whole global micro-batch.
`loss_type: apo_zero_unpaired` (D'Oosterlinck et al. 2024, unpaired eq. 7) drops z0:
1 - sigmoid(beta r) for desirable rows, sigmoid(beta r) for undesirable ones, and needs no mismatched pairs.

The step's loss is the mean over rows (weights multiply, they do not renormalise), as in TRL.

Logged metrics: `loss`, `kl` (z0), `rewards/accuracies` (share of rows on the side of z0 their label
asks for), `logps` (mean log-prob of the completions).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor, nn

from trainer.algorithms.common import LossOutput, scored_logits, sequence_logps
from trainer.runtime import all_reduce_sum

LOSS_TYPES = ("kto", "apo_zero_unpaired")


def kto_loss(logratios: Tensor, desirable: Tensor, kl: Tensor, *, beta: float, desirable_weight: float = 1.0,
             undesirable_weight: float = 1.0) -> Tensor:
    """KTO loss per row (eq. 8).

    Args:
        logratios: (B,) log pi(y|x) - log ref(y|x) of each row's completion.
        desirable: (B,) 1.0 for desirable rows, 0.0 for undesirable ones.
        kl: () the reference point z0 (a constant).
        beta: beta of the paper.
        desirable_weight, undesirable_weight: lambda_D and lambda_U.

    Returns:
        (B,) weighted losses.
    """
    chosen = desirable_weight * (1 - torch.sigmoid(beta * (logratios - kl)))  # (B,)
    rejected = undesirable_weight * (1 - torch.sigmoid(beta * (kl - logratios)))  # (B,)
    return torch.where(desirable.bool(), chosen, rejected)


def apo_zero_unpaired_loss(logratios: Tensor, desirable: Tensor, *, beta: float, desirable_weight: float = 1.0,
                           undesirable_weight: float = 1.0) -> Tensor:
    """APO-zero on unpaired rows: raise desirable completions, lower undesirable ones. (B,), (B,) -> (B,)."""
    chosen = desirable_weight * (1 - torch.sigmoid(beta * logratios))
    rejected = undesirable_weight * torch.sigmoid(beta * logratios)
    return torch.where(desirable.bool(), chosen, rejected)


def kl_reference_point(policy_logps: Tensor, reference_logps: Tensor) -> Tensor:
    """z0 = max(0, mean(log pi(y'|x) - log ref(y'|x))) over mismatched pairs, detached. (B,), (B,) -> ().

    Under a process group this is a collective: every rank's mean is averaged (ranks hold micro-batches
    of equal size) before the clamp, so a rank whose own estimate is negative still sees the global one.
    """
    mean = (policy_logps - reference_logps).mean().detach()
    if dist.is_initialized():
        mean = all_reduce_sum(mean.clone()) / dist.get_world_size()
    return mean.clamp(min=0)


def completion_logps(model: nn.Module, input_ids: Tensor, attention_mask: Tensor, labels: Tensor) -> Tensor:
    """(B,) summed log-probs of each row's labelled tokens."""
    inputs = {"input_ids": input_ids, "attention_mask": attention_mask}
    return sequence_logps(*scored_logits(model, inputs, labels))[0]


class KTOObjective:
    """Forward passes and loss of one unpaired micro-batch (`pad_unpaired`).

    Args:
        beta: beta of the paper (> 0).
        loss_type: `kto` or `apo_zero_unpaired`.
        desirable_weight, undesirable_weight: lambda_D and lambda_U.
        ref_model: The frozen reference.
    """

    def __init__(self, *, beta: float, ref_model: nn.Module, loss_type: str = "kto", desirable_weight: float = 1.0,
                 undesirable_weight: float = 1.0) -> None:
        if loss_type not in LOSS_TYPES:
            raise ValueError(f"unknown KTO loss_type {loss_type!r}, expected one of {LOSS_TYPES}")
        self.beta = beta
        self.ref_model = ref_model
        self.loss_type = loss_type
        self.weights = {"desirable_weight": desirable_weight, "undesirable_weight": undesirable_weight}

    def count_units(self, batch: dict[str, Tensor]) -> Tensor:
        return torch.tensor(float(batch["input_ids"].shape[0]))

    def reference_point(self, model: nn.Module, batch: dict[str, Tensor]) -> Tensor:
        """z0 from the batch's mismatched pairs (no gradient); 0 for `apo_zero_unpaired`, which has none."""
        if self.loss_type != "kto":
            return torch.zeros((), device=batch["input_ids"].device)
        with torch.no_grad():
            mismatched = (batch["kl_input_ids"], batch["kl_attention_mask"], batch["kl_labels"])
            return kl_reference_point(completion_logps(model, *mismatched), completion_logps(self.ref_model, *mismatched))

    def __call__(self, model: nn.Module, batch: dict[str, Tensor]) -> LossOutput:
        rows = (batch["input_ids"], batch["attention_mask"], batch["labels"])
        with torch.no_grad():  # the reference first, so its transient memory never stacks on the policy's activations
            reference = completion_logps(self.ref_model, *rows)  # (B,)
        kl = self.reference_point(model, batch)  # ()
        logps = completion_logps(model, *rows)  # (B,)
        desirable = batch["desirable"]  # (B,)
        logratios = logps - reference  # (B,)
        if self.loss_type == "kto":
            losses = kto_loss(logratios, desirable, kl, beta=self.beta, **self.weights)
        else:
            losses = apo_zero_unpaired_loss(logratios, desirable, beta=self.beta, **self.weights)
        margin = (logratios - kl).detach()  # (B,)
        on_its_side = torch.where(desirable.bool(), margin > 0, margin < 0).float()
        stats = {"loss": losses.detach().sum(), "kl": kl * len(losses), "rewards/accuracies": on_its_side.sum(),
                 "logps": logps.detach().sum()}
        return LossOutput(total=losses.sum(), count=self.count_units(batch), stats=stats)

