"""S3 outages in the middle of a run, through a loopback fault proxy in front of moto.

Every storage call retries with backoff up to `ALIGNFLOW_S3_RETRY_SECONDS`: an outage shorter than
that leaves a complete run with every interval checkpoint; a longer one ends the run non-zero with
one line naming the endpoint and the last durable checkpoint. Each test proves the outage really
hit the run (the proxy reset connections, the trainer logged retries).
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from tests.conftest import stage_dict
from tests.integration.fault_proxy import FaultProxy
from tests.integration.trainer_process import TrainerProcess, error_lines, run_trainer, write_config
from trainer.storage import get_storage
from trainer.storage.s3 import S3Storage


@pytest.fixture
def proxy(s3_endpoint):
    fault_proxy = FaultProxy(int(s3_endpoint.rsplit(":", 1)[1]))
    yield fault_proxy
    fault_proxy.close()


def keys(bucket: str, prefix: str) -> list[str]:
    return [uri.split("/", 3)[3] for uri in get_storage(f"s3://{bucket}").list(f"s3://{bucket}/{prefix}")]


def sft_config(output: str, tiny_model: Path, task_files: dict, **updates) -> dict:
    return stage_dict("sft", output, tiny_model, task_files["sft_train"],
                      **{"train": {"max_epochs": 4, "micro_batch_size": 8, "log_interval": 1},
                         "checkpoint": {"save_interval": 4, "keep_last": 0}, **updates})


@pytest.mark.parametrize("seconds", [6, pytest.param(120, marks=pytest.mark.slow)])
def test_outage_mid_run_leaves_a_complete_run_with_every_interval_checkpoint(seconds, proxy, bucket, tmp_path,
                                                                               tiny_model, task_files):
    output = f"s3://{bucket}/runs/sft"
    config = write_config(tmp_path / "sft.yaml", sft_config(output, tiny_model, task_files))
    child = TrainerProcess("sft", config, env={"AWS_ENDPOINT_URL": proxy.endpoint,
                                               "ALIGNFLOW_S3_RETRY_SECONDS": str(seconds * 2 + 30),
                                               "ALIGNFLOW_CACHE_DIR": str(tmp_path / "cache")})
    child.wait_for(r"saved checkpoint s3://.*/step-00000004")
    proxy.outage(seconds)
    code = child.wait(seconds * 3 + 240)

    assert code == 0, child.stderr[-3000:]
    assert proxy.refused > 0 and "retrying for up to" in child.stderr  # the outage really hit the run
    written = keys(bucket, "runs/sft")
    steps = sorted({key.split("/")[3] for key in written if "/step-" in key and key.endswith("trainer_state.json")})
    expected = sorted({*range(4, 41, 4), 10, 20, 30})  # every interval and every epoch end
    assert steps == [f"step-{step:08d}" for step in expected]
    assert {"runs/sft/model/model.safetensors", "runs/sft/final_metrics.json", "runs/sft/metrics.jsonl"} <= set(written)
    storage = S3Storage(retry_seconds=5)
    history = [json.loads(line) for line in storage.read_bytes(f"{output}/metrics.jsonl").decode().splitlines()]
    assert [r["step"] for r in history if "loss" in r] == list(range(1, 41))


def test_outage_longer_than_the_deadline_fails_with_one_line_naming_endpoint_and_durable_step(
        proxy, bucket, tmp_path, tiny_model, task_files):
    output = f"s3://{bucket}/runs/sft"
    config = write_config(tmp_path / "sft.yaml", sft_config(output, tiny_model, task_files))
    child = TrainerProcess("sft", config, env={"AWS_ENDPOINT_URL": proxy.endpoint, "ALIGNFLOW_S3_RETRY_SECONDS": "3",
                                               "ALIGNFLOW_CACHE_DIR": str(tmp_path / "cache")})
    child.wait_for(r"saved checkpoint s3://.*/step-00000028")
    proxy.cut()
    code = child.wait(240)

    assert code == 2, child.stderr[-3000:]
    assert "written again at the next save" in child.stderr  # background failures are one line each, not tracebacks
    assert "Traceback" not in child.stderr
    (line,) = error_lines(child.stderr)
    assert line.startswith("CheckpointError: checkpoint step-00000040 could not be saved")
    assert proxy.endpoint in line and line.endswith("last durable checkpoint: s3://" + bucket + "/runs/sft/checkpoints/step-00000028")
    proxy.restore()
    assert "runs/sft/model/model.safetensors" not in keys(bucket, "runs/sft")


def test_sigterm_with_s3_output_checkpoints_and_publishes_metrics(bucket, tmp_path, tiny_model, task_files):
    output = f"s3://{bucket}/runs/sft"
    config = write_config(tmp_path / "sft.yaml", sft_config(output, tiny_model, task_files,
                                                            checkpoint={"save_interval": 100}))
    child = TrainerProcess("sft", config, env={"ALIGNFLOW_CACHE_DIR": str(tmp_path / "cache")})
    child.wait_for(r"step 5/")
    child.send(signal.SIGTERM)
    signalled = time.monotonic()
    assert child.wait(60) == 143, child.stderr[-3000:]
    assert time.monotonic() - signalled < 20

    storage = S3Storage(retry_seconds=5)
    stopped_at = int(storage.read_bytes(f"{output}/checkpoints/latest").decode().removeprefix("step-"))
    history = [json.loads(line) for line in storage.read_bytes(f"{output}/metrics.jsonl").decode().splitlines()]
    assert stopped_at >= 5 and [r["step"] for r in history if "loss" in r] == list(range(1, stopped_at + 1))

    # The rerun on another machine (an empty cache) continues the published history: merged, not replaced.
    code, stderr = run_trainer("sft", config, env={"ALIGNFLOW_CACHE_DIR": str(tmp_path / "other-machine")})
    assert code == 0, stderr[-3000:]
    history = [json.loads(line) for line in storage.read_bytes(f"{output}/metrics.jsonl").decode().splitlines()]
    assert [r["step"] for r in history if "loss" in r] == list(range(1, 41))
