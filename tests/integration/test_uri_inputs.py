"""Every input by URI: `python -m trainer <stage> --config s3://...`, and KFP's `minio://` scheme for
the base model, datasets and outputs (what the launcher writes and a PyTorchJob then runs)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml

from tests.conftest import stage_dict
from trainer.storage import get_storage
from trainer.storage.transfer import upload_dir


def run_trainer(*args: str, env: dict[str, str], cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainer", *args], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=300)


def child_env(tmp_path) -> dict[str, str]:
    # What a pod gets: the S3 endpoint and keys in the environment, a cache of its own.
    return {**os.environ, "ALIGNFLOW_CACHE_DIR": str(tmp_path / "cache"),
            "PYTHONPATH": os.pathsep.join(sys.path)}


def test_config_on_s3_and_minio_inputs_train_and_export_to_minio(bucket, tiny_model, task_files, tmp_path):
    upload_dir(tiny_model, f"minio://{bucket}/models/tiny")
    storage = get_storage(f"s3://{bucket}")
    storage.upload_file(task_files["sft_train"], f"s3://{bucket}/data/train.jsonl")
    config = stage_dict("sft", f"minio://{bucket}/jobs/sft", f"minio://{bucket}/models/tiny",
                        f"minio://{bucket}/data/train.jsonl", train={"max_steps": 2})
    config["export_dir"] = f"minio://{bucket}/artifacts/model"
    storage.write_bytes(f"s3://{bucket}/jobs/sft.yaml", yaml.safe_dump(config).encode())
    workdir = tmp_path / "pod"
    workdir.mkdir()

    result = run_trainer("sft", "--config", f"s3://{bucket}/jobs/sft.yaml", env=child_env(tmp_path), cwd=workdir)

    assert result.returncode == 0, result.stderr[-3000:]
    exported = [uri.rsplit("/", 1)[1] for uri in storage.list(f"s3://{bucket}/artifacts/model")]
    assert {"config.json", "model.safetensors", "tokenizer_config.json"} <= set(exported)
    assert get_storage(f"minio://{bucket}").exists(f"minio://{bucket}/jobs/sft/final_metrics.json")
    assert storage.list(f"s3://{bucket}/jobs/sft/model") == []  # one copy of the weights: the export
    from transformers import AutoModelForCausalLM

    local = tmp_path / "downloaded"
    for uri in storage.list(f"s3://{bucket}/artifacts/model"):
        storage.download_file(uri, local / uri.rsplit("/", 1)[1])
    assert AutoModelForCausalLM.from_pretrained(local, local_files_only=True).num_parameters() > 0


def test_missing_config_object_is_one_line_naming_the_uri(bucket, tmp_path):
    result = run_trainer("sft", "--config", f"s3://{bucket}/nowhere.yaml", env=child_env(tmp_path), cwd=tmp_path)
    assert result.returncode == 2
    assert f"s3://{bucket}/nowhere.yaml" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("uri", ["gs://bucket/run/sft.yaml", "hdfs://host/run/sft.yaml"])
def test_unsupported_scheme_is_one_error_naming_it(uri, tmp_path):
    from trainer.config import load_config
    from trainer.errors import ConfigError

    with pytest.raises(ConfigError, match=uri.split("://")[0] + "://"):
        load_config("sft", uri)
