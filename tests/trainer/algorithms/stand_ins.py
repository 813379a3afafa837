"""Tiny real modules that stand in for a causal LM in loss tests, with log-probs easy to work out by hand."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from torch import nn


class BigramLM(nn.Module):
    """Causal LM stand-in: the logits after token i are row i of an embedding table.

    With `weights` W, p(j | i) = W[i][j] / sum(W[i]), whatever came before i.
    """

    def __init__(self, weights: list) -> None:
        super().__init__()
        self.table = nn.Embedding(len(weights), len(weights[0]))
        with torch.no_grad():
            self.table.weight.copy_(torch.tensor(weights, dtype=torch.float32).log())

    def forward(self, input_ids, attention_mask=None, position_ids=None, use_cache=None, logits_to_keep=0):
        logits = self.table(input_ids)  # (B, T, V)
        return SimpleNamespace(logits=logits[:, -logits_to_keep:] if logits_to_keep else logits)
