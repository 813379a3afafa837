"""Packing must not change the loss: a packed row scores exactly like the padded batch."""

from __future__ import annotations

import torch

from trainer.algorithms.sft import SFTObjective
from trainer.data.collate import pack_preference, pack_sft, pad_sft
from trainer.data.dataset import load_sft_dataset
from trainer.modeling.models import load_tokenizer
from trainer.tiny.model import build_tiny_llama


def test_packed_and_padded_losses_match(tiny_model, task_files):
    tokenizer = load_tokenizer(str(tiny_model))
    examples = load_sft_dataset(str(task_files["sft_train"]), tokenizer, 32, False).examples[:7]
    torch.manual_seed(0)
    model = build_tiny_llama(len(tokenizer), pad_token_id=tokenizer.pad_token_id).eval()
    objective = SFTObjective()

    packed = objective(model, pack_sft(examples))
    padded = objective(model, pad_sft(examples, tokenizer.pad_token_id))
    one_by_one = [objective(model, pad_sft([e], tokenizer.pad_token_id)) for e in examples]

    assert packed.count == padded.count == sum(o.count for o in one_by_one)
    torch.testing.assert_close(packed.total, padded.total, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(packed.total, sum(o.total for o in one_by_one), rtol=1e-5, atol=1e-5)


def make_example(length: int, first_token: int) -> dict:
    """A sample of `length` tokens numbered from `first_token`, every token but the first a label."""
    ids = list(range(first_token, first_token + length))
    return {"input_ids": ids, "labels": [-100] + ids[1:]}


def test_packing_fills_rows_no_longer_than_the_longest_sample():
    # Lengths 6, 2, 3, 4, 1: rows of at most 6 tokens, best fit longest first -> [6], [4, 2], [3, 1] + 2 pad.
    examples = [make_example(n, 100 * i) for i, n in enumerate([6, 2, 3, 4, 1])]
    batch = pack_sft(examples, pad_token_id=0)
    assert batch["input_ids"].shape == (3, 6)
    assert batch["input_ids"].tolist() == [
        [0, 1, 2, 3, 4, 5],                # the 6-token sample alone
        [300, 301, 302, 303, 100, 101],    # 4 + 2
        [200, 201, 202, 400, 0, 0],        # 3 + 1, then a 2-token pad segment
    ]
    # Positions restart at every sample and at the pad segment, so each is a sequence of its own.
    assert batch["position_ids"].tolist() == [[0, 1, 2, 3, 4, 5], [0, 1, 2, 3, 0, 1], [0, 1, 2, 0, 0, 1]]
    # A sample's first token is never a target, and the pad segment carries no labels.
    assert batch["labels"].tolist()[2] == [-100, 201, 202, -100, -100, -100]
    assert batch["num_tokens"] == 16 and batch["num_samples"] == 5
    assert "attention_mask" not in batch


def test_packing_keeps_every_token_of_every_sample_once(tiny_model, task_files):
    tokenizer = load_tokenizer(str(tiny_model))
    examples = load_sft_dataset(str(task_files["sft_train"]), tokenizer, 32, False).examples[:9]
    batch = pack_sft(examples, pad_token_id=tokenizer.pad_token_id)
    real = batch["labels"] != -100
    expected = sum(sum(label != -100 for label in e["labels"][1:]) for e in examples)
    assert int(real.sum()) == expected
    assert batch["input_ids"].shape[1] == max(len(e["input_ids"]) for e in examples)
    assert batch["num_tokens"] == sum(len(e["input_ids"]) for e in examples)


def test_packed_rows_do_not_attend_across_samples(tiny_model):
    # Lengths 5, 3, 2 pack into rows [5] and [3, 2]: the 2-token sample's logits there equal its logits alone.
    tokenizer = load_tokenizer(str(tiny_model))
    torch.manual_seed(0)
    model = build_tiny_llama(len(tokenizer), pad_token_id=tokenizer.pad_token_id).eval()
    examples = [make_example(5, 10), make_example(3, 20), make_example(2, 30)]
    packed = pack_sft(examples, pad_token_id=tokenizer.pad_token_id)
    assert packed["input_ids"].tolist()[1] == [20, 21, 22, 30, 31]
    with torch.no_grad():
        together = model(input_ids=packed["input_ids"], position_ids=packed["position_ids"], use_cache=False).logits
        alone = model(input_ids=torch.tensor([[30, 31]]), use_cache=False).logits
    torch.testing.assert_close(together[1, 3:], alone[0], rtol=1e-5, atol=1e-5)


def make_pair(prompt: list[int], chosen: list[int], rejected: list[int]) -> dict:
    """An encoded preference pair: the prompt unlabelled, each answer labelled."""
    return {"margin": 0.0,
            "chosen_input_ids": prompt + chosen, "chosen_labels": [-100] * len(prompt) + chosen,
            "rejected_input_ids": prompt + rejected, "rejected_labels": [-100] * len(prompt) + rejected}


def test_preference_packing_puts_all_2b_sequences_in_one_row_and_marks_their_boundaries():
    # Sequences: 0 chosen [1,10,11,12] (4), 1 chosen [2,20] (2), 2 rejected [1,13] (2), 3 rejected [2,21,22] (3),
    # laid out longest first in one row of their 11 tokens: 0, 3, 1, 2; no padding at all.
    pairs = [make_pair([1], [10, 11, 12], [13]), make_pair([2], [20], [21, 22])]
    batch = pack_preference(pairs, pad_token_id=0)
    assert batch["input_ids"].tolist() == [[1, 10, 11, 12, 2, 21, 22, 2, 20, 1, 13]]
    assert batch["sequence_ids"].tolist() == [[0, 0, 0, 0, 3, 3, 3, 1, 1, 2, 2]]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 3, 0, 1, 2, 0, 1, 0, 1]]
    # A sequence's first token is never a target, so no label is read across sequences.
    assert batch["labels"].tolist() == [[-100, 10, 11, 12, -100, 21, 22, -100, 20, -100, 13]]
    # Where each sequence ends (chosen 0-1, then rejected 2-3), and where each starts (varlen attention).
    assert batch["last_positions"].tolist() == [3, 8, 10, 6]
    assert batch["cu_seq_lens"].tolist() == [0, 4, 7, 9, 11] and batch["max_length"] == 4
    assert batch["num_tokens"] == 11 and batch["num_samples"] == 2
    assert batch["margin"].tolist() == [0.0, 0.0] and "attention_mask" not in batch
