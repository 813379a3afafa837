"""MLflow tracking against a real `mlflow server` (artifacts proxied to moto S3), and the embedded default."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import stage_dict
from tests.integration.fault_proxy import FaultProxy
from trainer.config import build_config
from trainer.supervised.stages import run_stage

REPO = Path(__file__).parents[2]


@pytest.fixture
def tracked(monkeypatch, mlflow_server):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
    from mlflow import MlflowClient

    return MlflowClient(mlflow_server)


def tracked_sft(tmp_path, tiny_model, task_files, **tracking) -> dict:
    return stage_dict("sft", tmp_path / "run", tiny_model, task_files["sft_train"], task_files["sft_eval"],
                      train={"max_steps": 6, "log_interval": 1},
                      tracking={"backend": "mlflow", "experiment_name": "tests"} | tracking)


def find_run(client, **tags):
    experiment = client.get_experiment_by_name("tests")
    query = " and ".join(f"tags.`{k}` = '{v}'" for k, v in tags.items())
    runs = client.search_runs([experiment.experiment_id], filter_string=query)
    assert len(runs) == 1, runs
    return runs[0]


def test_run_logs_params_metric_history_and_registered_model(tracked, tmp_path, tiny_model, task_files):
    config = tracked_sft(tmp_path, tiny_model, task_files, pipeline_run_id="pipeline-1",
                         registered_model_name="tiny-sft")
    run_stage(build_config("sft", config))

    run = find_run(tracked, **{"alignflow.pipeline_run_id": "pipeline-1"})
    assert run.data.params["optimizer.lr"] == "0.002"
    assert run.data.params["model.path"] == str(tiny_model)
    history = tracked.get_metric_history(run.info.run_id, "loss")
    assert [m.step for m in history] == [1, 2, 3, 4, 5, 6]
    assert "eval/loss" in run.data.metrics and "perf/tokens_per_second" in run.data.metrics
    assert run.info.status == "FINISHED"
    artifacts = {a.path for a in tracked.list_artifacts(run.info.run_id, "model")}
    assert {"model/config.json", "model/model.safetensors", "model/tokenizer.json"} <= artifacts
    versions = tracked.search_model_versions("name = 'tiny-sft'")
    assert [v.run_id for v in versions] == [run.info.run_id]


def test_stage_run_is_nested_under_the_pipeline_run(tracked, tmp_path, tiny_model, task_files):
    experiment_id = tracked.get_experiment_by_name("tests").experiment_id if tracked.get_experiment_by_name(
        "tests") else tracked.create_experiment("tests")
    parent = tracked.create_run(experiment_id, run_name="pipeline").info.run_id
    config = tracked_sft(tmp_path, tiny_model, task_files, parent_run_id=parent, pipeline_run_id="pipeline-2")
    run_stage(build_config("sft", config))

    child = find_run(tracked, **{"alignflow.pipeline_run_id": "pipeline-2"})
    assert child.data.tags["mlflow.parentRunId"] == parent
    assert child.data.tags["mlflow.runName"] == "sft"


def run_trainer(config: dict, tmp_path: Path, env: dict[str, str]) -> subprocess.Popen:
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    return subprocess.Popen([sys.executable, "-m", "trainer", "sft", "--config", str(path)], cwd=tmp_path,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_run_completes_when_the_tracking_server_stops(mlflow_server, tmp_path, tiny_model, task_files):
    from mlflow import MlflowClient

    # The trainer reaches the session's server through a proxy, which then cuts it off as a server that stops
    # would: open connections closed, new ones refused.
    proxy = FaultProxy(int(mlflow_server.rsplit(":", 1)[1]))
    env = {**os.environ, "MLFLOW_TRACKING_URI": proxy.endpoint, "MLFLOW_HTTP_REQUEST_TIMEOUT": "2",
           "OMP_NUM_THREADS": "1"}
    config = tracked_sft(tmp_path, tiny_model, task_files, experiment_name="server-stops")
    config["train"] = {"max_epochs": 30, "micro_batch_size": 4, "log_interval": 1}  # 600 steps
    trainer = run_trainer(config, tmp_path, env)
    try:
        client = MlflowClient(mlflow_server)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # wait for the first metric to reach the server
            experiment = client.get_experiment_by_name("server-stops")
            runs = client.search_runs([experiment.experiment_id]) if experiment else []
            if runs and runs[0].data.metrics:
                break
            time.sleep(0.5)
        else:
            pytest.fail("no metric reached the tracking server")
        proxy.cut()  # the server goes away mid-run
        _, stderr = trainer.communicate(timeout=300)
    finally:
        proxy.close()

    assert trainer.returncode == 0, stderr[-3000:]
    assert proxy.refused > 0 and "MLflow unreachable" in stderr
    assert (tmp_path / "run" / "model" / "config.json").is_file()
    assert len((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()) > 100  # nothing lost locally


def test_embedded_default_logs_to_local_mlflow_db(tmp_path, tiny_model, task_files):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "AWS_"))}
    config = tracked_sft(tmp_path, tiny_model, task_files)
    trainer = run_trainer(config, tmp_path, env)
    _, stderr = trainer.communicate(timeout=300)
    assert trainer.returncode == 0, stderr[-3000:]

    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    run = client.search_runs([client.get_experiment_by_name("tests").experiment_id])[0]
    assert len(client.get_metric_history(run.info.run_id, "loss")) == 6
    assert (tmp_path / "run" / "model" / "config.json").is_file()  # outputs stayed local


def test_stage_continues_the_run_named_by_mlflow_run_id(tracked, monkeypatch, tmp_path, tiny_model, task_files):
    experiment = tracked.get_experiment_by_name("tests")
    experiment_id = experiment.experiment_id if experiment else tracked.create_experiment("tests")
    run_id = tracked.create_run(experiment_id, run_name="made-by-the-pipeline").info.run_id
    monkeypatch.setenv("MLFLOW_RUN_ID", run_id)
    run_stage(build_config("sft", tracked_sft(tmp_path, tiny_model, task_files)))

    run = tracked.get_run(run_id)
    assert len(tracked.get_metric_history(run_id, "loss")) == 6
    assert run.data.params["data.max_length"] == "32"
    assert run.info.status == "FINISHED"
