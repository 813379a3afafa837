"""ORPO: monolithic preference optimisation without a reference model (Hong et al. 2024, "ORPO").

On chosen/rejected pairs, with P(y|x) = exp(mean over y's tokens of log pi) (eq. 2), the odds
odds(y|x) = P / (1 - P) and lambda the weight of the odds-ratio term (eqs. 6-7):

    L = -log pi(y_w|x) / abs(y_w)  -  lambda * log sigmoid(log odds(y_w|x) - log odds(y_l|x))

The first term is the supervised NLL of the chosen response, per token of that response (the
paper's L_SFT, averaged over the pairs). TRL's ORPO trainer differs there: its NLL averages over
every non-pad token of the chosen sequences of the micro-batch, the prompt included; the odds-ratio
term is the same. `log(1 - P)` is computed as log(-expm1(log P)) (or log1p(-P) below -ln 2), with the
mean log-prob kept below -1e-7 so a response the model is certain of gives a finite loss.

Logged metrics: `loss`, `nll_loss`, `log_odds_ratio` (mean log sigmoid of the log-odds difference),
`log_odds_chosen` (mean log-odds difference), `rewards/chosen`, `rewards/rejected` (lambda times the
mean log-prob, as TRL), `rewards/accuracies`, `rewards/margins`, `logps/chosen`, `logps/rejected` (sums).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from trainer.algorithms.common import LossOutput
from trainer.algorithms.dpo import chosen_nll_loss, num_sequences, preference_logps

LOG_HALF = -math.log(2)


def log1mexp(x: Tensor) -> Tensor:
    """log(1 - exp(x)) for x < 0, accurate at both ends (Maechler 2012). Any shape."""
    return torch.where(x < LOG_HALF, torch.log1p(-torch.exp(x)), torch.log(-torch.expm1(x)))


def odds_ratio_loss(chosen_avg_logps: Tensor, rejected_avg_logps: Tensor) -> tuple[Tensor, Tensor]:
    """ORPO's odds-ratio term per pair, -log sigmoid(log odds_w - log odds_l) (eq. 7), and the log-odds difference.

    Args:
        chosen_avg_logps, rejected_avg_logps: (B,) per-token mean log-probs of the responses (log P of eq. 2).

    Returns:
        (B,) losses and (B,) log odds(y_w|x) - log odds(y_l|x).
    """
    chosen, rejected = chosen_avg_logps.clamp(max=-1e-7), rejected_avg_logps.clamp(max=-1e-7)
    log_odds = (chosen - rejected) - (log1mexp(chosen) - log1mexp(rejected))  # (B,)
    return -F.logsigmoid(log_odds), log_odds


class ORPOObjective:
    """Forward pass and loss of one preference micro-batch, no reference.

    Args:
        beta: lambda, the weight of the odds-ratio term (TRL's `beta`; the paper uses 0.1 to 1).
    """

    def __init__(self, *, beta: float) -> None:
        self.beta = beta

    def count_units(self, batch: dict[str, Tensor]) -> Tensor:
        return torch.tensor(float(num_sequences(batch) // 2))

    def __call__(self, model: nn.Module, batch: dict[str, Tensor]) -> LossOutput:
        logps, num_tokens = preference_logps(model, batch)  # (2B,), (2B,)
        chosen, rejected = logps.chunk(2)  # (B,) each
        chosen_tokens, rejected_tokens = num_tokens.clamp(min=1).chunk(2)
        chosen_avg, rejected_avg = chosen / chosen_tokens, rejected / rejected_tokens  # (B,) log P
        nll = chosen_nll_loss(chosen, chosen_tokens)  # (B,)
        ratio_losses, log_odds = odds_ratio_loss(chosen_avg, rejected_avg)  # (B,) each
        losses = nll + self.beta * ratio_losses  # (B,)
        chosen_rewards, rejected_rewards = self.beta * chosen_avg.detach(), self.beta * rejected_avg.detach()
        stats = {
            "loss": losses.detach().sum(),
            "nll_loss": nll.detach().sum(),
            "log_odds_ratio": -ratio_losses.detach().sum(),
            "log_odds_chosen": log_odds.detach().sum(),
            "rewards/chosen": chosen_rewards.sum(),
            "rewards/rejected": rejected_rewards.sum(),
            "rewards/accuracies": (chosen_rewards > rejected_rewards).float().sum(),
            "rewards/margins": (chosen_rewards - rejected_rewards).sum(),
            "logps/chosen": chosen.detach().sum(),
            "logps/rejected": rejected.detach().sum(),
        }
        return LossOutput(total=losses.sum(), count=self.count_units(batch), stats=stats)
