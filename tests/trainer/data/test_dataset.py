"""Tests of dataset loading: readers (JSONL, Parquet, HF directory), row schemas, tokenization."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainer.data.dataset import LoadedDataset, load_preference_dataset, load_rows, load_sft_dataset
from trainer.data.tokenize import IGNORE_INDEX, encode_preference, encode_prompt, encode_sft
from trainer.errors import AlignflowError, DataError
from trainer.tiny.model import build_tokenizer

MAX_LENGTH = 512


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict:
    return {"role": "assistant", "content": text}


SFT_STRING_ROWS = [
    {"prompt": "2+2=", "completion": "4"},
    {"prompt": "Say hi: ", "completion": "hi"},
    {"prompt": "Q", "completion": "A"},
]
SFT_MESSAGE_ROWS = [
    {"messages": [user("hello"), assistant("hi there")]},
    {"messages": [{"role": "system", "content": "be brief"}, user("2+2?"), assistant("4")]},
]
PREFERENCE_ROWS = [
    {"prompt": "Pick: ", "chosen": "good", "rejected": "bad", "margin": 1.5},
    {"prompt": "Again: ", "chosen": "yes", "rejected": "no", "margin": 0.0},
]


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def write_parquet(path: Path, rows: list[dict]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def write_hf_directory(path: Path, rows: list[dict]) -> Path:
    import datasets

    datasets.Dataset.from_list(rows).save_to_disk(str(path))
    return path


def labelled_ids(input_ids: list[int], labels: list[int]) -> list[int]:
    return [token for token, label in zip(input_ids, labels) if label != IGNORE_INDEX]


def ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


# ---------------------------------------------------------------------------------------------
# Readers: the three formats agree


@pytest.mark.parametrize(
    ("rows", "loader"),
    [
        (SFT_STRING_ROWS, load_sft_dataset),
        (SFT_MESSAGE_ROWS, load_sft_dataset),
        (PREFERENCE_ROWS, load_preference_dataset),
    ],
    ids=["sft-strings", "sft-messages", "preference"],
)
def test_jsonl_parquet_and_datasets_directory_load_the_same_examples(tmp_path, tokenizer, rows, loader):
    paths = [
        write_jsonl(tmp_path / "rows.jsonl", rows),
        write_parquet(tmp_path / "rows.parquet", rows),
        write_hf_directory(tmp_path / "rows_hf", rows),
    ]
    loaded = [loader(str(path), tokenizer, MAX_LENGTH, False) for path in paths]
    for dataset, path in zip(loaded, paths):
        assert isinstance(dataset, LoadedDataset)
        assert dataset.num_skipped == 0
        assert dataset.path == str(path)
        assert len(dataset.examples) == len(rows)
    assert loaded[0].examples == loaded[1].examples == loaded[2].examples


def test_datasets_dict_directory_reads_its_train_split(tmp_path, tokenizer):
    import datasets

    directory = tmp_path / "dict_hf"
    datasets.DatasetDict({"train": datasets.Dataset.from_list(SFT_STRING_ROWS),
                          "test": datasets.Dataset.from_list(SFT_STRING_ROWS[:1])}).save_to_disk(str(directory))
    assert len(load_sft_dataset(str(directory), tokenizer, MAX_LENGTH, False).examples) == len(SFT_STRING_ROWS)


def test_datasets_dict_without_train_split_is_a_data_error(tmp_path):
    import datasets

    directory = tmp_path / "dict_hf"
    datasets.DatasetDict({"test": datasets.Dataset.from_list(SFT_STRING_ROWS)}).save_to_disk(str(directory))
    with pytest.raises(DataError, match=r"without a 'train' split"):
        load_rows(str(directory), "sft", skip_bad_rows=False)


def test_directory_that_is_not_a_saved_dataset_is_a_data_error(tmp_path):
    with pytest.raises(DataError, match=r"not a saved HF datasets directory"):
        load_rows(str(tmp_path), "sft", skip_bad_rows=False)


def test_missing_path_is_a_data_error(tmp_path):
    with pytest.raises(DataError, match=r"absent\.jsonl: no such file or directory"):
        load_rows(str(tmp_path / "absent.jsonl"), "sft", skip_bad_rows=False)


def test_unsupported_extension_is_a_data_error(tmp_path):
    path = tmp_path / "rows.csv"
    path.write_text("prompt,completion\na,b\n")
    with pytest.raises(DataError, match=r"rows\.csv: unsupported data format '\.csv'"):
        load_rows(str(path), "sft", skip_bad_rows=False)


def test_corrupt_parquet_file_is_a_data_error(tmp_path):
    path = tmp_path / "rows.parquet"
    path.write_bytes(b"not parquet at all")
    with pytest.raises(DataError, match=r"cannot read Parquet"):
        load_rows(str(path), "sft", skip_bad_rows=False)


def test_empty_file_is_a_data_error(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_text("")
    with pytest.raises(DataError, match=r"empty\.jsonl: no usable rows \(0 skipped\)"):
        load_rows(str(path), "sft", skip_bad_rows=False)


def test_data_error_is_an_alignflow_error():
    assert issubclass(DataError, AlignflowError)


# ---------------------------------------------------------------------------------------------
# Bad rows name file:line


def test_invalid_json_line_names_file_and_line(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(SFT_STRING_ROWS[0]) + "\n" + json.dumps(SFT_STRING_ROWS[1]) + "\n{not json\n")
    with pytest.raises(DataError, match=rf"^{path}:3: invalid JSON: "):
        load_rows(str(path), "sft", skip_bad_rows=False)


def test_a_line_that_is_not_utf8_is_a_bad_row_naming_file_and_line(tmp_path, tokenizer):
    path = tmp_path / "rows.jsonl"
    good = [json.dumps(row).encode() for row in SFT_STRING_ROWS]
    path.write_bytes(b"\n".join([good[0], b'{"prompt": "a", "completion": "b\xff"}', good[1]]) + b"\n")
    with pytest.raises(DataError, match=rf"^{path}:2: not UTF-8 text: byte 0xff at byte 33 of the line"):
        load_rows(str(path), "sft", skip_bad_rows=False)
    dataset = load_sft_dataset(str(path), tokenizer, MAX_LENGTH, True)  # the rest of the file still reads
    assert dataset.num_skipped == 1 and len(dataset.examples) == 2


def test_an_empty_preference_response_is_an_answer(tmp_path, tokenizer):
    row = {"prompt": "Say something rude: ", "chosen": "", "rejected": "no"}  # a refusal, trained as EOS
    (example,) = load_preference_dataset(str(write_jsonl(tmp_path / "rows.jsonl", [row])), tokenizer, MAX_LENGTH,
                                         False).examples
    assert labelled_ids(example["chosen_input_ids"], example["chosen_labels"]) == [tokenizer.eos_token_id]


def test_blank_lines_are_ignored_but_still_counted_in_line_numbers(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(SFT_STRING_ROWS[0]) + "\n\n" + json.dumps({"prompt": "a"}) + "\n")
    with pytest.raises(DataError, match=rf"^{path}:3: missing field 'completion'$"):
        load_rows(str(path), "sft", skip_bad_rows=False)


@pytest.mark.parametrize(
    ("schema", "good_rows", "bad_row", "expected"),
    [
        ("sft", SFT_STRING_ROWS, {"prompt": "a"}, "missing field 'completion'"),
        ("sft", SFT_MESSAGE_ROWS, {"messages": [{"role": "robot", "content": "x"}, assistant("y")]},
         "messages[0].role is 'robot', expected one of"),
        ("sft", SFT_MESSAGE_ROWS, {"messages": [user("only a question")]}, "messages has no assistant turn"),
        ("sft", SFT_STRING_ROWS, {"prompt": "a", "completion": [assistant("b")]},
         "prompt and completion must both be strings or both be message lists"),
        ("preference", PREFERENCE_ROWS, {"prompt": "p", "chosen": "a", "rejected": "b", "margin": "high"},
         "margin is 'high', expected a number"),
        ("preference", PREFERENCE_ROWS, {"prompt": "p", "chosen": "a", "rejected": "b", "margin": True},
         "margin is True, expected a number"),
        ("prompt", [{"prompt": "p"}], {"prompt": "p", "answer": 4}, "answer is 4, expected a string"),
        ("sft", SFT_STRING_ROWS, ["not", "an", "object"], "expected an object, found list"),
        ("sft", SFT_STRING_ROWS, {"prompt": "a", "completion": ""}, "completion is empty: nothing to train on"),
        ("sft", SFT_STRING_ROWS, {"prompt": "a", "completion": " \n"}, "completion is empty: nothing to train on"),
        ("sft", SFT_MESSAGE_ROWS, {"messages": [user("q"), assistant(""), user("q2"), assistant(" ")]},
         "every assistant turn of messages is empty: nothing to train on"),
        ("sft", SFT_MESSAGE_ROWS, {"prompt": [user("q")], "completion": [user("not an answer")]},
         "completion has no assistant turn to train on"),
    ],
    ids=["missing-completion", "bad-role", "no-assistant", "mixed-kinds", "margin-string", "margin-bool",
         "answer-not-string", "not-an-object", "empty-completion", "blank-completion", "empty-assistant-turns",
         "completion-without-assistant"],
)
def test_schema_bad_row_names_file_line_and_problem(tmp_path, schema, good_rows, bad_row, expected):
    path = write_jsonl(tmp_path / "rows.jsonl", [good_rows[0], good_rows[-1], bad_row])
    with pytest.raises(DataError) as err:
        load_rows(str(path), schema, skip_bad_rows=False)
    assert str(err.value).startswith(f"{path}:3: {expected}")


def test_schema_bad_parquet_row_names_file_and_row_number(tmp_path):
    rows = [PREFERENCE_ROWS[0], {"prompt": "", "chosen": "a", "rejected": "b", "margin": 1.0}]
    path = write_parquet(tmp_path / "rows.parquet", rows)
    with pytest.raises(DataError, match=rf"^{path}:row 2: prompt is empty$"):
        load_rows(str(path), "preference", skip_bad_rows=False)


def test_row_that_fails_to_encode_names_file_and_line(tmp_path, tokenizer):
    # A prompt longer than max_length leaves no completion token to train on.
    path = write_jsonl(tmp_path / "rows.jsonl", [{"prompt": "a" * 20, "completion": "b"}])
    with pytest.raises(DataError, match=rf"^{path}:1: no completion tokens left within max_length=8$"):
        load_sft_dataset(str(path), tokenizer, 8, False)


def test_skip_bad_rows_skips_and_counts_them(tmp_path, tokenizer):
    path = tmp_path / "rows.jsonl"
    lines = [
        json.dumps(SFT_STRING_ROWS[0]),                                  # 1 good
        "{not json",                                                     # 2 invalid JSON
        json.dumps({"prompt": "a"}),                                     # 3 missing completion
        json.dumps({"messages": [{"role": "robot", "content": "x"}]}),   # 4 bad role
        json.dumps(SFT_STRING_ROWS[1]),                                  # 5 good
        json.dumps({"prompt": "a" * 40, "completion": "b"}),             # 6 too long to encode
    ]
    path.write_text("\n".join(lines) + "\n")
    dataset = load_sft_dataset(str(path), tokenizer, 16, True)
    assert dataset.num_skipped == 4
    assert dataset.examples == [encode_sft(tokenizer, SFT_STRING_ROWS[0], 16),
                                encode_sft(tokenizer, SFT_STRING_ROWS[1], 16)]


def test_skip_bad_rows_still_fails_when_no_row_is_usable(tmp_path):
    path = write_jsonl(tmp_path / "rows.jsonl", [{"prompt": "a"}, {"completion": "b"}])
    with pytest.raises(DataError, match=r"no usable rows \(2 skipped\)"):
        load_rows(str(path), "sft", skip_bad_rows=True)


def test_skip_bad_rows_counts_bad_preference_rows(tmp_path, tokenizer):
    rows = [PREFERENCE_ROWS[0], {"prompt": "p", "chosen": "a", "rejected": "b", "margin": "x"}, PREFERENCE_ROWS[1]]
    dataset = load_preference_dataset(str(write_jsonl(tmp_path / "rows.jsonl", rows)), tokenizer, MAX_LENGTH, True)
    assert dataset.num_skipped == 1
    assert [example["margin"] for example in dataset.examples] == [1.5, 0.0]


def test_columnar_file_with_both_sft_row_kinds_loads(tmp_path, tokenizer):
    # Columnar formats give every row every column; a row of the other kind has nulls there.
    rows = [{"messages": SFT_MESSAGE_ROWS[0]["messages"], "prompt": None, "completion": None},
            {"messages": None, **SFT_STRING_ROWS[0]}]
    path = write_parquet(tmp_path / "rows.parquet", rows)
    assert len(load_sft_dataset(str(path), tokenizer, MAX_LENGTH, False).examples) == 2


# ---------------------------------------------------------------------------------------------
# Tokenization


def test_plain_strings_label_only_completion_and_eos(tokenizer):
    example = encode_sft(tokenizer, {"prompt": "2+2=", "completion": "4"}, MAX_LENGTH)
    prompt_ids = ids(tokenizer, "2+2=")
    completion_ids = ids(tokenizer, "4") + [tokenizer.eos_token_id]
    assert example["input_ids"] == prompt_ids + completion_ids
    # prompt:   2    +    2    =     -> no loss
    # response: 4  <|end|>           -> labels equal the ids
    assert example["labels"] == [IGNORE_INDEX] * len(prompt_ids) + completion_ids


def test_long_sample_is_truncated_to_max_length(tokenizer):
    example = encode_sft(tokenizer, {"prompt": "ab", "completion": "cdefgh"}, 5)
    assert len(example["input_ids"]) == len(example["labels"]) == 5
    assert example["input_ids"] == ids(tokenizer, "abcde")


def test_chat_row_labels_only_assistant_content_and_end_token(tokenizer):
    row = {"messages": [{"role": "system", "content": "S"}, user("hi"), assistant("yo"), user("q"),
                        assistant("ok")]}
    example = encode_sft(tokenizer, row, MAX_LENGTH)
    rendered = tokenizer.apply_chat_template(row["messages"], tokenize=False)
    assert example["input_ids"] == ids(tokenizer, rendered)
    trained = labelled_ids(example["input_ids"], example["labels"])
    assert tokenizer.decode(trained) == "yo<|end|>ok<|end|>"
    # Labels equal the ids wherever they are set.
    assert all(label in (IGNORE_INDEX, token) for token, label in zip(example["input_ids"], example["labels"]))
    # Neither the role headers nor the user/system turns carry loss.
    assistant_header = tokenizer.convert_tokens_to_ids("<|assistant|>")
    assert assistant_header in example["input_ids"]
    assert assistant_header not in trained
    untrained = [token for token, label in zip(example["input_ids"], example["labels"]) if label == IGNORE_INDEX]
    assert tokenizer.decode(untrained) == "<|system|>S<|end|><|user|>hi<|end|><|assistant|><|user|>q<|end|><|assistant|>"


def test_chat_prompt_completion_labels_the_completion_turn(tokenizer):
    example = encode_sft(tokenizer, {"prompt": [user("hi")], "completion": [assistant("yo")]}, MAX_LENGTH)
    assert tokenizer.decode(example["input_ids"]) == "<|user|>hi<|end|><|assistant|>yo<|end|>"
    assert tokenizer.decode(labelled_ids(example["input_ids"], example["labels"])) == "yo<|end|>"


def test_chat_prompt_assistant_turns_are_not_trained(tokenizer):
    prompt = [user("a"), assistant("EARLIER"), user("b")]
    example = encode_sft(tokenizer, {"prompt": prompt, "completion": [assistant("c")]}, MAX_LENGTH)
    assert tokenizer.decode(labelled_ids(example["input_ids"], example["labels"])) == "c<|end|>"


def test_preference_pair_shares_the_prompt_prefix(tokenizer):
    row = {"prompt": "Pick: ", "chosen": "good", "rejected": "bad", "margin": 2}
    example = encode_preference(tokenizer, row, MAX_LENGTH)
    prompt_ids = ids(tokenizer, "Pick: ")
    n = len(prompt_ids)
    assert example["chosen_input_ids"][:n] == example["rejected_input_ids"][:n] == prompt_ids
    assert example["chosen_input_ids"][n:] == ids(tokenizer, "good") + [tokenizer.eos_token_id]
    assert example["rejected_input_ids"][n:] == ids(tokenizer, "bad") + [tokenizer.eos_token_id]
    assert example["chosen_labels"] == [IGNORE_INDEX] * n + example["chosen_input_ids"][n:]
    assert example["rejected_labels"] == [IGNORE_INDEX] * n + example["rejected_input_ids"][n:]
    assert example["margin"] == 2.0 and isinstance(example["margin"], float)


def test_chat_preference_pair_shares_the_prompt_and_labels_only_the_responses(tokenizer):
    row = {"prompt": [user("pick")], "chosen": [assistant("good")], "rejected": [assistant("bad")]}
    example = encode_preference(tokenizer, row, MAX_LENGTH)
    prefix = ids(tokenizer, "<|user|>pick<|end|><|assistant|>")
    assert example["chosen_input_ids"][:len(prefix)] == example["rejected_input_ids"][:len(prefix)] == prefix
    assert tokenizer.decode(labelled_ids(example["chosen_input_ids"], example["chosen_labels"])) == "good<|end|>"
    assert tokenizer.decode(labelled_ids(example["rejected_input_ids"], example["rejected_labels"])) == "bad<|end|>"
    assert example["margin"] == 0.0  # no margin field


def test_chat_prompt_for_generation_ends_with_assistant_header(tokenizer):
    assert tokenizer.decode(encode_prompt(tokenizer, [user("hi")])) == "<|user|>hi<|end|><|assistant|>"
    assert encode_prompt(tokenizer, "plain") == ids(tokenizer, "plain")


def test_messages_without_chat_template_are_a_data_error():
    tokenizer = build_tokenizer()
    tokenizer.chat_template = None
    with pytest.raises(DataError, match="no chat template"):
        encode_sft(tokenizer, SFT_MESSAGE_ROWS[0], MAX_LENGTH)
