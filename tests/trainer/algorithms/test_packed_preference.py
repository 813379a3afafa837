"""Packing a preference batch must not change DPO or reward-model losses, statistics or gradients.

`pack_preference` puts the 2B chosen and rejected sequences into one row of whole sequences; the
objectives read per-sequence log-prob sums (DPO) or last-token rewards (RM) back out of it. Each test
runs the same pairs packed and padded through the same tiny Llama and compares, under the
variable-length attention that training uses for packed rows and under plain `sdpa` (which masks the
row block-diagonally).
"""

from __future__ import annotations

import random

import pytest
import torch

from trainer.algorithms.dpo import DPOObjective
from trainer.algorithms.reward import RewardObjective
from trainer.data.collate import pack_preference, pad_preference
from trainer.modeling.attention import VARLEN_ATTENTION, use_varlen_attention
from trainer.modeling.models import ValueHeadModel
from trainer.tiny.model import build_tiny_llama

VOCAB, PAD = 40, 0


def make_pairs(num_pairs: int, seed: int = 0) -> list[dict]:
    """Encoded pairs: prompt 2-6 tokens, chosen and rejected answers 1-12 tokens each, drawn independently."""
    rng = random.Random(seed)
    pairs = []
    for _ in range(num_pairs):
        prompt = [rng.randrange(1, VOCAB) for _ in range(rng.randint(2, 6))]
        pair = {"margin": rng.uniform(0, 1)}
        for side in ("chosen", "rejected"):
            answer = [rng.randrange(1, VOCAB) for _ in range(rng.randint(1, 12))]
            pair[f"{side}_input_ids"] = prompt + answer
            pair[f"{side}_labels"] = [-100] * len(prompt) + answer
        pairs.append(pair)
    return pairs


def build_llama(seed: int, attention: str) -> torch.nn.Module:
    model = build_tiny_llama(VOCAB, seed=seed, pad_token_id=PAD)
    if attention == VARLEN_ATTENTION:
        assert use_varlen_attention(model)
    assert model.config._attn_implementation == attention
    return model


ATTENTIONS = pytest.mark.parametrize("attention", [VARLEN_ATTENTION, "sdpa"])


def gradients(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return grads


def assert_same_step(objective, model, packed: dict, padded: dict) -> None:
    """Same total, count, stats and parameter gradients from the packed and the padded batch."""
    outputs = []
    for batch in (packed, padded):
        output = objective(model, batch)
        output.total.backward()
        outputs.append((output, gradients(model)))
    (packed_out, packed_grads), (padded_out, padded_grads) = outputs
    torch.testing.assert_close(packed_out.total, padded_out.total, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(packed_out.count, padded_out.count)
    assert packed_out.stats.keys() == padded_out.stats.keys()
    for key in packed_out.stats:
        torch.testing.assert_close(packed_out.stats[key], padded_out.stats[key], rtol=1e-5, atol=1e-5, msg=key)
    assert packed_grads.keys() == padded_grads.keys() and packed_grads
    for name, expected in padded_grads.items():  # float32 sums in another order: equal to 1e-5 of the largest entry
        atol = 1e-5 * float(expected.abs().max().clamp(min=0.1))
        torch.testing.assert_close(packed_grads[name], expected, rtol=1e-4, atol=atol, msg=name)


def test_pairs_really_pack_into_fewer_tokens():
    pairs = make_pairs(6)
    packed, padded = pack_preference(pairs, PAD), pad_preference(pairs, PAD)
    assert packed["input_ids"].numel() == packed["num_tokens"] == int(padded["attention_mask"].sum())
    assert packed["input_ids"].numel() < padded["input_ids"].numel()


@ATTENTIONS
@pytest.mark.parametrize("loss_type", ["sigmoid", "ipo", "simpo"])
def test_packed_and_padded_dpo_agree(loss_type, attention):
    pairs = make_pairs(6)
    policy = build_llama(1, attention)
    reference = build_llama(2, attention).eval().requires_grad_(False)
    objective = DPOObjective(beta=0.5, loss_type=loss_type, rpo_alpha=0.3, ref_model=reference)
    assert_same_step(objective, policy, pack_preference(pairs, PAD), pad_preference(pairs, PAD))


@ATTENTIONS
def test_packed_and_padded_reference_logps_agree(attention):
    # What precompute_ref_log_probs stores per pair does not depend on the layout either.
    pairs = make_pairs(5)
    objective = DPOObjective(beta=0.1, ref_model=build_llama(2, attention).eval())
    packed = objective.reference_logps(pack_preference(pairs, PAD))
    padded = objective.reference_logps(pad_preference(pairs, PAD))
    torch.testing.assert_close(packed, padded, rtol=1e-5, atol=1e-5)
    assert bool((packed < 0).all())  # every sequence has answer tokens, so every sum is a real log-prob


@ATTENTIONS
def test_packed_and_padded_reward_model_agree(attention):
    pairs = make_pairs(6)
    model = ValueHeadModel(build_llama(1, attention).model)
    assert_same_step(RewardObjective(use_margin=True), model, pack_preference(pairs, PAD), pad_preference(pairs, PAD))
