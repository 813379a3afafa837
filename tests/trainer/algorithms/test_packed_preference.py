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
from trainer.data.collate import pack_or_share_preference, pack_preference, pad_preference, shared_prompt_tokens
from trainer.modeling.attention import VARLEN_ATTENTION, use_varlen_attention
from trainer.modeling.models import ValueHeadModel
from trainer.tiny.model import build_tiny_llama

VOCAB, PAD = 40, 0


def make_pairs(num_pairs: int, seed: int = 0, prompt_tokens: tuple[int, int] = (2, 6),
               answer_tokens: tuple[int, int] = (1, 12)) -> list[dict]:
    """Encoded pairs: prompt 2-6 tokens, chosen and rejected answers 1-12 tokens each, drawn independently."""
    rng = random.Random(seed)
    pairs = []
    for _ in range(num_pairs):
        prompt = [rng.randrange(1, VOCAB) for _ in range(rng.randint(*prompt_tokens))]
        pair = {"margin": rng.uniform(0, 1)}
        for side in ("chosen", "rejected"):
            answer = [rng.randrange(1, VOCAB) for _ in range(rng.randint(*answer_tokens))]
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
@pytest.mark.parametrize("loss_type", ["sigmoid", "simpo"])
def test_shared_prompts_agree_with_the_packed_step(loss_type, attention, monkeypatch):
    # dpo.share_prompts: a padded batch runs each pair's prompt once, in the policy and the reference; the step
    # (loss, statistics, gradients) is the packed one's.
    import trainer.algorithms.dpo as dpo

    shared = []
    original = dpo.shared_prompt_logits
    monkeypatch.setattr(dpo, "shared_prompt_logits", lambda *a, **k: shared.append(original(*a, **k)) or shared[-1])
    pairs = make_pairs(6, prompt_tokens=(8, 12), answer_tokens=(1, 4))
    policy = build_llama(1, attention)
    reference = build_llama(2, attention).eval().requires_grad_(False)
    objective = DPOObjective(beta=0.5, loss_type=loss_type, rpo_alpha=0.3, ref_model=reference, share_prompts=True)
    padded = pad_preference(pairs, PAD)
    assert_same_step(objective, policy, pack_preference(pairs, PAD), padded)
    calls = 1 if loss_type == "simpo" else 2  # SimPO reads no reference
    assert len(shared) == calls and all(logits is not None for logits in shared)
    assert shared[0].shape[:2] == (12, padded["input_ids"].shape[1] - 7)  # from the last column of the shortest prompt


def test_each_batch_goes_in_the_form_that_computes_fewer_tokens():
    # Prompts longer than their answers: padded, each prompt run once (8 x 10 + 16 x (16 - 10) = 176 at most,
    # against 16 x 12 or more packed). Short prompts, long answers of unequal length: packed.
    long_prompts = make_pairs(8, prompt_tokens=(10, 12), answer_tokens=(1, 4))
    assert shared_prompt_tokens(long_prompts) < sum(len(p["chosen_input_ids"]) + len(p["rejected_input_ids"])
                                                    for p in long_prompts)
    assert "attention_mask" in pack_or_share_preference(long_prompts, PAD)
    long_answers = make_pairs(8, prompt_tokens=(2, 3), answer_tokens=(5, 40))
    assert "sequence_ids" in pack_or_share_preference(long_answers, PAD)


@ATTENTIONS
def test_packed_and_padded_reward_model_agree(attention):
    pairs = make_pairs(6)
    model = ValueHeadModel(build_llama(1, attention).model)
    assert_same_step(RewardObjective(use_margin=True), model, pack_preference(pairs, PAD), pad_preference(pairs, PAD))
