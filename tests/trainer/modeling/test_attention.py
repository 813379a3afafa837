"""The variable-length attention used for packed preference rows: exact per sequence, sdpa otherwise."""

from __future__ import annotations

import json

import torch

from trainer.modeling.attention import VARLEN_ATTENTION, use_varlen_attention
from trainer.tiny.model import build_tiny_llama

SEQUENCES = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14]]


def packed_row() -> dict[str, torch.Tensor]:
    """The three sequences in one row, positions restarting, boundaries 0, 5, 7, 10."""
    boundaries = torch.tensor([0, 5, 7, 10], dtype=torch.int32)
    return {"input_ids": torch.tensor([sum(SEQUENCES, [])]),
            "position_ids": torch.tensor([[p for s in SEQUENCES for p in range(len(s))]]),
            "cu_seq_lens_q": boundaries, "cu_seq_lens_k": boundaries, "max_length_q": 5, "max_length_k": 5}


@torch.no_grad()
def test_each_packed_sequence_sees_only_itself():
    model = build_tiny_llama(20, seed=3).eval()
    assert use_varlen_attention(model) and model.config._attn_implementation == VARLEN_ATTENTION
    together = model(**packed_row(), use_cache=False).logits  # (1, 10, V)
    for sequence, start in zip(SEQUENCES, [0, 5, 7], strict=True):
        alone = model(input_ids=torch.tensor([sequence]), use_cache=False).logits  # (1, n, V)
        torch.testing.assert_close(together[0, start:start + len(sequence)], alone[0], rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_restarting_positions_alone_split_rows_too():
    # No boundaries passed, two rows (pack_sft's layout): [5..9] and [10, 11, 12, 13, 14] as 2 + 3.
    model = build_tiny_llama(20, seed=3).eval()
    use_varlen_attention(model)
    rows = model(input_ids=torch.tensor([SEQUENCES[0], SEQUENCES[1] + SEQUENCES[2]]),
                 position_ids=torch.tensor([[0, 1, 2, 3, 4], [0, 1, 0, 1, 2]]), use_cache=False).logits  # (2, 5, V)
    for row, start, sequence in [(0, 0, SEQUENCES[0]), (1, 0, SEQUENCES[1]), (1, 2, SEQUENCES[2])]:
        alone = model(input_ids=torch.tensor([sequence]), use_cache=False).logits
        torch.testing.assert_close(rows[row, start:start + len(sequence)], alone[0], rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_cached_generation_is_unchanged():
    prompts = {"input_ids": torch.tensor([[0, 5, 6], [7, 8, 9]]), "attention_mask": torch.tensor([[0, 1, 1], [1, 1, 1]])}
    sdpa = build_tiny_llama(20, seed=3).eval()
    varlen = build_tiny_llama(20, seed=3).eval()
    use_varlen_attention(varlen)
    for inputs in (prompts, {"input_ids": prompts["input_ids"][1:]}):  # left-padded, and one unpadded prompt
        expected = sdpa.generate(**inputs, max_new_tokens=6, do_sample=False, pad_token_id=0)
        assert torch.equal(varlen.generate(**inputs, max_new_tokens=6, do_sample=False, pad_token_id=0), expected)


@torch.no_grad()
def test_without_boundaries_it_is_plain_sdpa_padding_included():
    padded = {"input_ids": torch.tensor([[5, 6, 7], [8, 9, 0]]), "attention_mask": torch.tensor([[1, 1, 1], [1, 1, 0]])}
    sdpa = build_tiny_llama(20, seed=3).eval()
    varlen = build_tiny_llama(20, seed=3).eval()
    use_varlen_attention(varlen)
    torch.testing.assert_close(varlen(**padded, use_cache=False).logits, sdpa(**padded, use_cache=False).logits)


def test_eager_models_are_left_alone_and_exports_do_not_name_the_implementation(tmp_path):
    eager = build_tiny_llama(20)
    eager.config._attn_implementation = "eager"
    assert not use_varlen_attention(eager) and eager.config._attn_implementation == "eager"
    model = build_tiny_llama(20)
    use_varlen_attention(model)
    model.save_pretrained(tmp_path)
    assert VARLEN_ATTENTION not in json.dumps(json.loads((tmp_path / "config.json").read_text()))


def test_a_sliding_window_limits_each_query_to_the_last_window_tokens_with_or_without_boundaries():
    from trainer.modeling.attention import varlen_sdpa_attention

    query, key, value = torch.randn(3, 2, 2, 5, 4, generator=torch.Generator().manual_seed(0)).unbind(0)  # (B, H, T, D)
    band = torch.tensor([[1, 0, 0, 0, 0],  # window 2: each token sees itself and the one before it
                         [1, 1, 0, 0, 0],
                         [0, 1, 1, 0, 0],
                         [0, 0, 1, 1, 0],
                         [0, 0, 0, 1, 1]], dtype=torch.bool)
    expected = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=band).transpose(1, 2)
    module = torch.nn.Module().eval()
    positions = torch.arange(5).expand(2, 5)
    for inputs in ({}, {"position_ids": positions}):  # rows as sequences; positions restarting per row
        output, _ = varlen_sdpa_attention(module, query, key, value, None, sliding_window=2, **inputs)  # (B, T, H, D)
        torch.testing.assert_close(output, expected, rtol=1e-6, atol=1e-6)
    unwindowed, _ = varlen_sdpa_attention(module, query, key, value, None, sliding_window=5)  # covers the rows
    assert not torch.allclose(unwindowed, expected)


@torch.no_grad()
def test_an_unpadded_batch_without_positions_keeps_its_rows_apart():
    """transformers gives a batch called without position ids (or with an all-ones mask) one (1, T) row of them;
    each row is still its own sequence, as under plain sdpa (they were read as one sequence before)."""
    ids = torch.tensor([[5, 6, 7, 8, 9], [10, 11, 12, 13, 14], [4, 3, 2, 1, 0]])
    model = build_tiny_llama(20, seed=3).eval()
    plain = model(input_ids=ids, use_cache=False).logits
    use_varlen_attention(model)
    torch.testing.assert_close(model(input_ids=ids, use_cache=False).logits, plain, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False).logits,
                               plain, rtol=1e-5, atol=1e-5)
