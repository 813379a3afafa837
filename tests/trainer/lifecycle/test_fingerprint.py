"""A checkpoint knows its data by content: a dataset rewritten at the same path is refused in one
line naming the file; the same bytes (even rewritten) resume; checkpoints fingerprinted by path
only, before content was recorded, are compared as they were."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.conftest import make_config
from tests.integration.conftest import bucket, s3_endpoint, s3_env  # noqa: F401 (fixtures: a moto S3 server)
from trainer.errors import CheckpointError
from trainer.lifecycle.data_identity import content_identity
from trainer.lifecycle.resume import CONTENT_SUFFIX, fingerprint_differences
from trainer.storage import get_storage
from trainer.supervised.stages import run_stage


def sft(output, model, data):
    return make_config("sft", output, model, data, train={"max_epochs": 1, "micro_batch_size": 8, "log_interval": 1},
                       checkpoint={"save_interval": 0, "keep_last": 0})


def checkpointed_run(tmp_path, tiny_model, task_files):
    """A tiny SFT run stopped at step 2 with a checkpoint, on its own copy of the data."""
    data = tmp_path / "sft_train.jsonl"
    shutil.copy(task_files["sft_train"], data)
    output = tmp_path / "out"
    run_stage(sft(output, tiny_model, data), stop_after_steps=2)
    return data, output


def test_data_changed_at_the_same_path_is_refused_in_one_line_naming_the_file(tmp_path, tiny_model, task_files):
    data, output = checkpointed_run(tmp_path, tiny_model, task_files)
    rows = data.read_text().splitlines()
    first = json.loads(rows[0])
    first["completion"] = str(int(first["completion"]) + 1)  # one row edited (a wrong sum), same path and length
    data.write_text("\n".join([json.dumps(first), *rows[1:]]) + "\n")

    with pytest.raises(CheckpointError) as err:
        run_stage(sft(output, tiny_model, data))
    message = str(err.value)
    assert "\n" not in message
    assert f"step-00000002 belongs to another run: {data} (data.train_path) changed since the checkpoint" in message
    assert not (output / "model").exists()


def test_same_bytes_rewritten_at_the_same_path_resume(tmp_path, tiny_model, task_files):
    data, output = checkpointed_run(tmp_path, tiny_model, task_files)
    data.write_bytes(data.read_bytes())  # a new mtime and inode, the same content

    run_stage(sft(output, tiny_model, data))
    assert (output / "model" / "model.safetensors").is_file()


def test_a_resumed_run_hashes_its_data_once_and_its_new_checkpoints_carry_the_content(tmp_path, tiny_model, task_files,
                                                                                      monkeypatch):
    import trainer.lifecycle.resume as resume

    data, output = checkpointed_run(tmp_path, tiny_model, task_files)
    hashed = []

    def counting(path: str) -> dict:  # the real hash, counted
        hashed.append(path)
        return content_identity(path)

    monkeypatch.setattr(resume, "content_identity", counting)
    run_stage(make_config("sft", output, tiny_model, data, train={"max_epochs": 1, "micro_batch_size": 8},
                          checkpoint={"save_interval": 2, "keep_last": 0}))
    assert hashed == [str(data)]  # vetting the checkpoint hashed it; the new manifests reuse that
    newest = sorted((output / "checkpoints").glob("step-*"))[-1]
    manifest = json.loads((newest / "manifest.json").read_text())
    assert newest.name > "step-00000002"
    assert manifest["fingerprint"]["data.train_path" + CONTENT_SUFFIX] == content_identity(str(data))


def test_checkpoint_without_a_content_entry_is_compared_by_path_as_before(tmp_path, tiny_model, task_files):
    data, output = checkpointed_run(tmp_path, tiny_model, task_files)
    manifest_path = output / "checkpoints" / "step-00000002" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    assert manifest["fingerprint"]["data.train_path" + CONTENT_SUFFIX] == {str(data): content_identity(str(data))[str(data)]}
    del manifest["fingerprint"]["data.train_path" + CONTENT_SUFFIX]  # as written before content was recorded
    manifest_path.write_text(json.dumps(manifest))
    data.write_text(data.read_text().replace("1", "2", 1))  # changed, but the old checkpoint cannot tell

    run_stage(sft(output, tiny_model, data))
    assert (output / "model" / "model.safetensors").is_file()


def test_a_dataset_directory_names_the_file_that_changed(tmp_path):
    directory = tmp_path / "dataset"
    (directory / "train").mkdir(parents=True)
    (directory / "dataset_dict.json").write_text('{"splits": ["train"]}')
    shard = directory / "train" / "data-00000-of-00001.arrow"
    shard.write_bytes(b"rows" * 1000)
    (directory / ".cache").mkdir()
    (directory / ".cache" / "scratch").write_bytes(b"not data")
    before = {"data.train_path": str(directory), "data.train_path" + CONTENT_SUFFIX: content_identity(str(directory))}
    assert set(before["data.train_path" + CONTENT_SUFFIX]) == {str(directory / "dataset_dict.json"), str(shard)}

    (directory / ".cache" / "scratch").write_bytes(b"still not data")
    assert content_identity(str(directory)) == before["data.train_path" + CONTENT_SUFFIX]
    shard.write_bytes(b"rows" * 999 + b"ROWS")
    after = {**before, "data.train_path" + CONTENT_SUFFIX: content_identity(str(directory))}
    (difference,) = fingerprint_differences(before, after)
    assert difference.startswith(f"{shard} (data.train_path) changed since the checkpoint: sha256:")


def test_an_s3_object_and_prefix_are_known_by_their_etags(bucket):  # noqa: F811
    storage = get_storage(f"s3://{bucket}")
    storage.write_bytes(f"s3://{bucket}/data/train.jsonl", b'{"row": 1}\n')
    storage.write_bytes(f"s3://{bucket}/ds/train/shard.arrow", b"a" * 100)
    file_before, prefix_before = content_identity(f"s3://{bucket}/data/train.jsonl"), content_identity(f"s3://{bucket}/ds")
    assert list(file_before) == [f"s3://{bucket}/data/train.jsonl"]
    assert list(prefix_before) == [f"s3://{bucket}/ds/train/shard.arrow"]
    assert all(value.startswith("etag:") for value in [*file_before.values(), *prefix_before.values()])

    storage.write_bytes(f"s3://{bucket}/data/train.jsonl", b'{"row": 1}\n')  # same bytes: same ETag
    assert content_identity(f"s3://{bucket}/data/train.jsonl") == file_before
    storage.write_bytes(f"s3://{bucket}/data/train.jsonl", b'{"row": 2}\n')
    storage.write_bytes(f"s3://{bucket}/ds/train/shard.arrow", b"b" * 100)
    assert content_identity(f"s3://{bucket}/data/train.jsonl") != file_before
    assert content_identity(f"s3://{bucket}/ds") != prefix_before


def test_a_missing_path_has_no_content_and_adds_no_difference(tmp_path):
    assert content_identity(str(tmp_path / "nowhere.jsonl")) == {}
    saved = {"data.train_path": "x", "data.train_path" + CONTENT_SUFFIX: {"x": "sha256:aa"}}
    assert fingerprint_differences(saved, {**saved, "data.train_path" + CONTENT_SUFFIX: {}}) == []
