"""Datasets, checkpoints and models in S3 (a moto server on loopback), through `trainer.storage`."""

from __future__ import annotations

import os

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import make_config
from trainer.checkpointing.checkpoint import CheckpointManager, TrainerState
from trainer.parallel.booster import Booster, SinglePlugin
from trainer.runtime import DistributedEnv
from trainer.storage import get_storage
from trainer.storage.s3 import MB, S3Storage
from trainer.storage.transfer import cached_copy, upload_dir
from trainer.supervised.stages import run_stage


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ALIGNFLOW_CACHE_DIR", str(tmp_path / "cache"))


def upload_inputs(bucket: str, tiny_model, task_files) -> dict[str, str]:
    upload_dir(tiny_model, f"s3://{bucket}/models/tiny")
    storage = get_storage(f"s3://{bucket}")
    for name in ("sft_train", "sft_eval"):
        storage.upload_file(task_files[name], f"s3://{bucket}/data/{name}.jsonl")
    return {"model": f"s3://{bucket}/models/tiny", "train": f"s3://{bucket}/data/sft_train.jsonl",
            "eval": f"s3://{bucket}/data/sft_eval.jsonl"}


def keys(bucket: str, prefix: str = "") -> list[str]:
    return [uri.split("/", 3)[3] for uri in get_storage(f"s3://{bucket}").list(f"s3://{bucket}/{prefix}")]


def test_stage_reads_model_and_data_from_s3_and_writes_outputs_there(bucket, tiny_model, task_files, tmp_path):
    inputs = upload_inputs(bucket, tiny_model, task_files)
    output = f"s3://{bucket}/runs/sft"
    run_stage(make_config("sft", output, inputs["model"], inputs["train"], inputs["eval"], train={"max_steps": 4}))

    written = keys(bucket, "runs/sft")
    assert {"runs/sft/model/config.json", "runs/sft/model/model.safetensors", "runs/sft/final_metrics.json",
            "runs/sft/metrics.jsonl", "runs/sft/checkpoints/latest"} <= set(written)
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(str(cached_copy(f"{output}/model")))  # loads as an HF model


def test_large_file_goes_up_in_parts(bucket, tmp_path):
    storage = S3Storage(multipart_threshold=5 * MB, max_concurrency=2)
    source = tmp_path / "big.bin"
    source.write_bytes(os.urandom(12 * MB))
    storage.upload_file(source, f"s3://{bucket}/big.bin")

    # A multipart object's ETag ends in "-<number of parts>": 12 MB in 5 MB parts is 3.
    assert storage.etag(f"s3://{bucket}/big.bin").endswith("-3")
    storage.download_file(f"s3://{bucket}/big.bin", tmp_path / "back.bin")
    assert (tmp_path / "back.bin").read_bytes() == source.read_bytes()


def test_resume_from_s3_checkpoint_gives_identical_parameters(bucket, tiny_model, task_files, tmp_path, caplog):
    def config(output):
        return make_config("sft", output, tiny_model, task_files["sft_train"],
                           train={"max_epochs": 2, "micro_batch_size": 8}, checkpoint={"save_interval": 3})

    run_stage(config(tmp_path / "straight"))
    output = f"s3://{bucket}/runs/resumed"
    run_stage(config(output), stop_after_steps=7)
    assert "runs/resumed/checkpoints/step-00000007/trainer_state.json" in keys(bucket, "runs/resumed")
    with caplog.at_level("INFO", logger="trainer.checkpointing.checkpoint"):
        run_stage(config(output))
    assert f"resumed from {output}/checkpoints/step-00000007 " in caplog.text  # the URI, not a scratch copy

    straight = load_file(tmp_path / "straight" / "model" / "model.safetensors")
    resumed = load_file(cached_copy(f"{output}/model/model.safetensors"))
    assert all(torch.equal(straight[k], resumed[k]) for k in straight)


def make_manager(root: str, keep_last: int = 0):
    booster = Booster(SinglePlugin(DistributedEnv(0, 0, 1), torch.device("cpu")))
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    booster.register_optimizer(model, optimizer)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    return CheckpointManager(root, booster, keep_last), {"model": (model, optimizer, scheduler)}


def test_half_written_checkpoint_in_s3_is_ignored(bucket):
    root = f"s3://{bucket}/ckpt"
    manager, components = make_manager(root)
    manager.save(components, TrainerState(global_step=2), 2)
    # Step 3's objects were uploaded but its marker and the `latest` pointer never were.
    storage = get_storage(root)
    storage.write_bytes(f"{root}/step-00000003/model.pt", b"partial")
    assert manager.latest() == f"{root}/step-00000002"
    state = manager.load(manager.latest(), components)
    assert state["global_step"] == 2


def test_retention_in_s3_keeps_the_last_complete_checkpoints(bucket):
    root = f"s3://{bucket}/ckpt"
    manager, components = make_manager(root, keep_last=2)
    for step in (1, 2, 3, 4):
        manager.save(components, TrainerState(global_step=step), step, block=step == 4)
        manager.wait()
    steps = sorted({key.split("/")[1] for key in keys(bucket, "ckpt") if "/step-" in key})
    assert steps == ["step-00000003", "step-00000004"]


def test_background_save_lets_training_continue_and_completes(bucket):
    root = f"s3://{bucket}/async"
    manager, components = make_manager(root)
    model = components["model"][0]
    before = {k: v.clone() for k, v in model.state_dict().items()}
    manager.save(components, TrainerState(global_step=1), 1, block=False)
    torch.nn.init.zeros_(model.weight)  # training goes on while the upload runs
    manager.wait()
    manager.load(manager.latest(), components)
    assert torch.equal(model.weight, before["weight"])  # the snapshot was taken before the change


def test_parquet_dataset_loads_from_s3(bucket, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from trainer.data.dataset import load_rows

    path = tmp_path / "rows.parquet"
    pq.write_table(pa.Table.from_pylist([{"prompt": "1+1=", "answer": "2"}, {"prompt": "", "answer": "0"}]), path)
    uri = f"s3://{bucket}/data/rows.parquet"
    get_storage(uri).upload_file(path, uri)
    from trainer.errors import DataError

    with pytest.raises(DataError, match=f"^{uri}:row 2: prompt is empty"):
        load_rows(uri, "prompt", skip_bad_rows=False)
    assert load_rows(uri, "prompt", skip_bad_rows=True).num_skipped == 1


def test_missing_s3_object_is_a_clear_error(bucket):
    from trainer.errors import DataError, StorageError

    with pytest.raises((StorageError, DataError), match=f"s3://{bucket}/nothing.jsonl"):
        from trainer.data.dataset import load_rows

        load_rows(f"s3://{bucket}/nothing.jsonl", "prompt", skip_bad_rows=False)


def test_experience_buffer_and_weight_versions_work_on_s3(bucket):
    from trainer.asynchronous.buffer import FileBuffer
    from trainer.asynchronous.weights import latest_version, load_version, publish_weights
    from trainer.rollout.experience import Experience

    writer, reader = FileBuffer(f"s3://{bucket}/buffer"), FileBuffer(f"s3://{bucket}/buffer", poll_interval=0.05)
    ids = torch.tensor([[5, 6, 7]])
    writer.put(Experience(input_ids=ids, attention_mask=torch.ones_like(ids), action_mask=torch.ones_like(ids),
                          position_ids=torch.arange(3)[None], scores=torch.tensor([1.0]), version=3))
    writer.close()
    got = reader.get(timeout=5)
    assert torch.equal(got.input_ids, ids) and got.version == 3
    assert reader.get(timeout=5) is None  # closed and drained
    assert keys(bucket, "buffer") == ["buffer/CLOSED", "buffer/batch-00000001.safetensors"]  # kept until ...
    reader.discard_through(1)  # ... a checkpoint covers them
    assert keys(bucket, "buffer") == ["buffer/CLOSED", "buffer/DISCARDED"]

    weights = f"s3://{bucket}/weights"
    for version in range(3):
        publish_weights(weights, {"w": torch.full((2,), float(version))}, version)
    assert latest_version(weights) == 2
    version, state = load_version(weights)
    assert version == 2 and torch.equal(state["w"], torch.full((2,), 2.0))
    assert sorted(keys(bucket, "weights")) == ["weights/LATEST", "weights/version-00000001.safetensors",
                                              "weights/version-00000002.safetensors"]
