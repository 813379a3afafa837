"""Local mode: a PyTorchJob manifest runs as local processes with the operator's environment."""

from __future__ import annotations

import os
import sys

import pytest
import yaml

from components.launcher.kinds.pytorchjob.manifest import build_pytorchjob
from components.launcher.local.runner import _cpu_shares, run_local
from components.launcher.pod.spec import JobSpec
from tests.conftest import stage_dict
from trainer.errors import LaunchError


def job_for(tmp_path, config: dict, **changes) -> dict:
    path = tmp_path / "stage.yaml"
    path.write_text(yaml.safe_dump(config))
    spec = dict(name="af-local-test", stage="sft", config_uri=str(path), image="ignored:locally", num_nodes=2,
                nproc_per_node=1, env={"OMP_NUM_THREADS": "1"}, restart_policy="OnFailure", backoff_limit=0)
    spec.update(changes)
    return build_pytorchjob(JobSpec(**spec))


def test_two_replica_job_trains_across_both(tmp_path, tiny_model, task_files):
    config = stage_dict("sft", tmp_path / "out", tiny_model, task_files["sft_train"], train={"max_steps": 3},
                        parallel={"plugin": "ddp"})
    lines: list[str] = []
    job = job_for(tmp_path, config)
    result = run_local(job, timeout=300, log=lines.append)

    assert result.attempts == 1
    assert (tmp_path / "out" / "model" / "config.json").is_file()
    # Two nodes make an elastic job (Worker replicas only); locally it runs with a static rendezvous.
    assert list(job["spec"]["pytorchReplicaSpecs"]) == ["Worker"] and "elasticPolicy" in job["spec"]
    assert any(line.startswith("[worker-0]") for line in lines)
    assert any(line.startswith("[worker-1]") for line in lines)
    # Each replica was pinned to its own half of this machine's CPUs, and the trainer sized its threads to it.
    cpus = len(os.sched_getaffinity(0))
    share = cpus // 2 if cpus >= 2 else cpus
    (threads,) = [line for line in lines if line.startswith("[worker-0]") and "torch intra-op threads" in line]
    assert f"threads: {share} ({share} CPUs available" in threads
    params = yaml.safe_load((tmp_path / "out" / "config.yaml").read_text())
    assert params["parallel"]["plugin"] == "ddp"


def test_cpu_shares_split_this_processs_cpus_between_the_replicas(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 6})
    assert _cpu_shares(2) == [{0, 1, 2}, {3, 6}]
    assert _cpu_shares(5) == [{0}, {1}, {2}, {3}, {6}]
    assert _cpu_shares(6) == [None] * 6  # fewer CPUs than replicas: no pinning
    assert _cpu_shares(1) == [None]  # one replica keeps every CPU


def test_failing_job_fails_the_task_with_its_log_tail_after_its_retries(tmp_path, tiny_model):
    config = stage_dict("sft", tmp_path / "out", tiny_model, tmp_path / "missing.jsonl")
    lines: list[str] = []
    with pytest.raises(LaunchError) as err:
        run_local(job_for(tmp_path, config, num_nodes=1, backoff_limit=1), timeout=300, log=lines.append)

    message = str(err.value)
    assert "af-local-test failed" in message and "exited with code" in message
    assert "missing.jsonl: no such file or directory" in message  # the trainer's own error, from the tail
    # backoffLimit 1 with restartPolicy OnFailure: the job ran twice.
    assert sum("DataError" in line for line in lines) == 2


def test_job_past_its_deadline_is_killed_and_reported(tmp_path):
    job = job_for(tmp_path, {}, num_nodes=1)
    container = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    container["command"] = [sys.executable, "-c", "import time; print('working', flush=True); time.sleep(60)"]
    with pytest.raises(LaunchError, match="timed out") as err:
        run_local(job, timeout=3, log=lambda line: None)
    assert "working" in str(err.value)


def test_secret_references_resolve_from_this_environment(tmp_path, monkeypatch, caplog):
    from components.launcher.pod.spec import SecretEnv

    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "from-the-local-environment")
    monkeypatch.delenv("MLFLOW_TRACKING_TOKEN", raising=False)
    monkeypatch.delenv("AWS_ACCESS_KEY_ID", raising=False)
    job = job_for(tmp_path, {}, num_nodes=1, secret_env=[
        SecretEnv("AWS_SECRET_ACCESS_KEY", "s3", "AWS_SECRET_ACCESS_KEY"),
        SecretEnv("AWS_ACCESS_KEY_ID", "s3", "AWS_ACCESS_KEY_ID"),
        SecretEnv("MLFLOW_TRACKING_TOKEN", "mlflow", "MLFLOW_TRACKING_TOKEN", optional=True)])
    container = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    container["command"] = [sys.executable, "-c", "import os; print(os.environ['AWS_SECRET_ACCESS_KEY'], "
                            "os.environ.get('MLFLOW_TRACKING_TOKEN'), os.environ['OMP_NUM_THREADS'])"]
    lines: list[str] = []
    with caplog.at_level("WARNING", logger="components.launcher"):
        run_local(job, timeout=60, log=lines.append)
    assert lines == ["[master-0] from-the-local-environment None 1"]
    # A missing required Secret value is said once; an optional one is not.
    warnings = [r.getMessage() for r in caplog.records if "comes from Secret" in r.getMessage()]
    assert warnings == ["local mode: AWS_ACCESS_KEY_ID comes from Secret s3 on Kubernetes and is not set here"]
