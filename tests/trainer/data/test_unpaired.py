"""Unpaired feedback rows (KTO): the schema, encoding and the mismatched pairs of a batch."""

from __future__ import annotations

import json

import pytest

from trainer.data.collate import pad_unpaired
from trainer.data.dataset import load_unpaired_dataset
from trainer.data.schemas import check_unpaired_row
from trainer.data.tokenize import IGNORE_INDEX, encode_unpaired
from trainer.errors import DataError
from trainer.tiny.model import build_tokenizer
from trainer.tiny.task import preference_rows, unpaired_rows


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


@pytest.mark.parametrize(("row", "problem"), [
    ({"prompt": "2+2=", "completion": "4"}, "label is None, expected true (desirable) or false (undesirable)"),
    ({"prompt": "2+2=", "completion": "4", "label": 1}, "label is 1, expected true (desirable) or false (undesirable)"),
    ({"prompt": "2+2=", "label": True}, "missing field 'completion'"),
    ({"prompt": "", "completion": "4", "label": True}, "prompt is empty"),
    ({"prompt": [{"role": "user", "content": "hi"}], "completion": "4", "label": True},
     "prompt and completion must both be strings or both be message lists"),
])
def test_a_bad_unpaired_row_says_what_is_wrong(row, problem):
    assert check_unpaired_row(row) == problem


def test_a_good_unpaired_row_passes_and_an_empty_completion_is_allowed():
    assert check_unpaired_row({"prompt": "2+2=", "completion": "", "label": False}) is None


def test_encode_unpaired_marks_the_prompt_and_labels_only_the_completion(tokenizer):
    example = encode_unpaired(tokenizer, {"prompt": "2+2=", "completion": "4", "label": True}, max_length=32)
    assert example["prompt_length"] == 4 and example["desirable"] is True
    assert example["labels"][:4] == [IGNORE_INDEX] * 4
    assert example["labels"][4:] == example["input_ids"][4:]  # "4" and EOS
    assert tokenizer.decode(example["input_ids"][4:]) == "4" + tokenizer.eos_token


def test_encode_unpaired_with_messages_puts_the_assistant_header_in_the_prompt(tokenizer):
    row = {"prompt": [{"role": "user", "content": "2+2="}], "completion": [{"role": "assistant", "content": "4"}],
           "label": False}
    example = encode_unpaired(tokenizer, row, max_length=64)
    prompt_text = tokenizer.apply_chat_template(row["prompt"], tokenize=False, add_generation_prompt=True)
    assert tokenizer.decode(example["input_ids"][:example["prompt_length"]]) == prompt_text


def test_mismatched_pairs_of_encoded_rows_join_a_prompt_to_the_previous_rows_completion(tokenizer):
    rows = [{"prompt": "1+1=", "completion": "2", "label": True}, {"prompt": "3+3=", "completion": "7", "label": False}]
    batch = pad_unpaired([encode_unpaired(tokenizer, row, 32) for row in rows], tokenizer.pad_token_id, 32)
    texts = [tokenizer.decode([t for t in ids if t != tokenizer.pad_token_id]) for ids in batch["kl_input_ids"].tolist()]
    assert texts == ["1+1=7" + tokenizer.eos_token, "3+3=2" + tokenizer.eos_token]
    labelled = [[t for t in labels if t != IGNORE_INDEX] for labels in batch["kl_labels"].tolist()]
    assert [tokenizer.decode(ids) for ids in labelled] == ["7" + tokenizer.eos_token, "2" + tokenizer.eos_token]


def test_the_tiny_tasks_unpaired_rows_label_each_pairs_answers(tmp_path, tokenizer):
    pairs = preference_rows(1, seed=0)[:2]
    rows = unpaired_rows(pairs)
    assert [(r["completion"], r["label"]) for r in rows[:2]] == [(pairs[0]["chosen"], True), (pairs[0]["rejected"], False)]
    path = tmp_path / "kto.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows) + '{"prompt": "x", "completion": "y"}\n')
    with pytest.raises(DataError, match=r"kto.jsonl:5: label is None"):
        load_unpaired_dataset(str(path), tokenizer, 32, skip_bad_rows=False)
    assert len(load_unpaired_dataset(str(path), tokenizer, 32, skip_bad_rows=True).examples) == 4
