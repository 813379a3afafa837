"""Packing must not change the loss: a packed row scores exactly like the padded batch."""

from __future__ import annotations

import torch

from trainer.algorithms.sft import SFTObjective
from trainer.data.collate import pack_sft, pad_sft
from trainer.data.dataset import load_sft_dataset
from trainer.models import load_tokenizer
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


def test_packed_row_has_restarting_positions_and_no_cross_sample_target(tiny_model, task_files):
    tokenizer = load_tokenizer(str(tiny_model))
    examples = load_sft_dataset(str(task_files["sft_train"]), tokenizer, 32, False).examples[:3]
    batch = pack_sft(examples)
    lengths = [len(e["input_ids"]) for e in examples]
    starts = [0, lengths[0], lengths[0] + lengths[1]]
    assert batch["input_ids"].shape == (1, sum(lengths))
    assert [batch["position_ids"][0, s].item() for s in starts] == [0, 0, 0]
    # The first token of each sample is never a target of the token before it.
    assert all(batch["labels"][0, s].item() == -100 for s in starts)
    assert "attention_mask" not in batch
