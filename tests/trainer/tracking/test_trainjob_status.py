"""The TrainJob's progress (KEP-2779): what rank 0 reports, how often, and that a refusing endpoint leaves training be.

Against the emulated Kubeflow Trainer status server (tests/cluster/trainer_status.py: real HTTPS on loopback, the
bearer-token check, the CRD's schema) with a TrainJob and its pod in the emulated API server's store.
"""

from __future__ import annotations

import math
import time

import pytest

from tests.cluster.store import Store
from tests.cluster.tls import server_context, write_serving_certificate
from tests.cluster.trainer_status import TrainerStatusServer, audience
from trainer.runtime import TrainJobStatusEnv, read_trainjob_status_env
from trainer.tracking.trainjob_status import ProgressState, TrainJobStatusReporter, build_status_reporter

NS, JOB, POD = "team", "af-sft-1", "af-sft-1-node-0-0-x1y2z"


@pytest.fixture
def status_server(tmp_path):
    store = Store()
    store.create("trainjobs", {"metadata": {"name": JOB, "namespace": NS}, "spec": {"runtimeRef": {"name": "r"}}})
    store.create("pods", {"metadata": {"name": POD, "namespace": NS,
                                       "labels": {"jobset.sigs.k8s.io/jobset-name": JOB}}, "spec": {}})
    cert, key = write_serving_certificate(tmp_path / "pki")
    server = TrainerStatusServer(store, server_context(cert, key), cert.read_bytes())
    server.start()
    yield server, cert
    server.stop()


def env_for(server: TrainerStatusServer, cert, tmp_path, *, pod: str = POD, job: str = JOB) -> TrainJobStatusEnv:
    """What Trainer's plugin injects: the URL, the CA file and the projected token file (the kubelet writes it)."""
    token = tmp_path / "token"
    token.write_text(server.issue(NS, pod, audience(NS, job)))
    return read_trainjob_status_env({"KUBEFLOW_TRAINER_SERVER_URL": server.url(NS, JOB),
                                     "KUBEFLOW_TRAINER_SERVER_CA_CERT": str(cert),
                                     "KUBEFLOW_TRAINER_SERVER_TOKEN": str(token)})


def test_progress_and_latest_metrics_reach_the_trainjob_at_a_bounded_rate(status_server, tmp_path):
    server, cert = status_server
    reporter = TrainJobStatusReporter(env_for(server, cert, tmp_path), min_interval_seconds=0.5)
    started = time.monotonic()
    for step in range(1, 21):  # 20 logged steps in about 1 s: a fast loop must not mean 20 requests
        reporter.log_metrics({"loss": 3.0 - 0.1 * step, "lr": 1e-4, "perf/tokens_per_second": 1500.0,
                              "progress/epoch": 1.0 + (step > 10), "progress/total_epochs": 2.0,
                              "progress/total_steps": 20.0}, step)
        time.sleep(0.05)
    reporter.close()
    elapsed = time.monotonic() - started
    status = server.store.get("trainjobs", NS, JOB)["status"]["trainerStatus"]
    metrics = {item["name"]: item["value"] for item in status["metrics"]}
    # The last state is sent on close, whatever the interval: step 20 of 20, epoch 2 of 2, the last loss.
    assert status["progressPercentage"] == 100 and status["estimatedRemainingSeconds"] == 0
    assert metrics == {"currentStep": "20", "loss": "1", "tokensPerSecond": "1500", "currentEpoch": "2",
                       "totalEpochs": "2", "totalSteps": "20"}  # lr is not a progress metric
    assert status["lastUpdatedTime"].endswith("Z")
    codes = [request.code for request in server.requests]
    assert codes and set(codes) == {200}
    assert 2 <= len(codes) <= math.ceil(elapsed / 0.5) + 1  # one per interval at most, plus the final one


def test_an_online_stage_reports_episodes_and_reward():
    state = ProgressState()
    state.update({"episode/reward_mean": 0.25, "progress/episode": 3.0, "progress/total_episodes": 4.0}, 12)
    status = state.trainer_status()
    assert status["progressPercentage"] == 50  # two of four episodes done, the third under way
    assert {"name": "reward", "value": "0.25"} in status["metrics"]
    assert {"name": "currentEpisode", "value": "3"} in status["metrics"]
    assert "estimatedRemainingSeconds" not in status  # no step total: no estimate


def test_a_refused_update_never_reaches_training(status_server, tmp_path, caplog):
    server, cert = status_server
    # A token issued to a pod of another TrainJob: the server answers 403; the reporter warns once and goes on.
    reporter = TrainJobStatusReporter(env_for(server, cert, tmp_path, pod="someone-else", job="other"),
                                      min_interval_seconds=0.05)
    for step in range(1, 4):
        reporter.log_metrics({"loss": 1.0}, step)
        time.sleep(0.1)
    reporter.close()
    assert {request.code for request in server.requests} == {403}
    assert "trainerStatus" not in (server.store.get("trainjobs", NS, JOB).get("status") or {})
    assert reporter.num_sent == 0
    assert sum("cannot report progress" in record.message for record in caplog.records) == 1


@pytest.mark.parametrize("endpoint", ["silent", "refusing"])
def test_an_absent_status_endpoint_costs_the_exit_at_most_a_few_seconds(status_server, tmp_path, endpoint):
    """A controller that accepts the connection and never answers (a hung endpoint) or no listener at all: `close`
    returns within CLOSE_SECONDS, however many states are left to send (it used to wait up to 15 s)."""
    import socket

    from trainer.tracking.trainjob_status import CLOSE_SECONDS

    server, cert = status_server
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    if endpoint == "silent":
        listener.listen(8)  # connections complete in the kernel's backlog; nobody reads or answers
    port = listener.getsockname()[1]
    env = env_for(server, cert, tmp_path)
    env = TrainJobStatusEnv(url=f"https://127.0.0.1:{port}/apis/x", ca_cert_path=env.ca_cert_path,
                            token_path=env.token_path)
    try:
        reporter = TrainJobStatusReporter(env, min_interval_seconds=0.05)
        reporter.log_metrics({"loss": 1.0}, 1)
        time.sleep(0.2)  # the first send is under way (silent) or failed (refusing)
        reporter.log_metrics({"loss": 0.5}, 2)
        started = time.monotonic()
        reporter.close()
        assert time.monotonic() - started <= CLOSE_SECONDS + 0.5
        assert reporter.num_sent == 0
    finally:
        listener.close()


def test_no_reporter_where_the_cluster_takes_no_progress():
    # A PyTorchJob, an older Trainer, the TrainJobStatus gate off, a local run: no variables, nothing is built.
    assert read_trainjob_status_env({"RANK": "0"}) is None
    assert build_status_reporter(None) is None


def test_a_supervised_stage_reports_its_steps_and_epochs(status_server, tmp_path, monkeypatch, tiny_model,
                                                        task_files):
    from tests.conftest import make_config
    from trainer.supervised.stages import run_stage

    server, cert = status_server
    env = env_for(server, cert, tmp_path)
    monkeypatch.setenv("KUBEFLOW_TRAINER_SERVER_URL", env.url)
    monkeypatch.setenv("KUBEFLOW_TRAINER_SERVER_CA_CERT", env.ca_cert_path)
    monkeypatch.setenv("KUBEFLOW_TRAINER_SERVER_TOKEN", env.token_path)
    # The real loop: its metrics (loss, throughput, progress/*) are all the reporter reads; the loop knows nothing of it.
    run_stage(make_config("sft", tmp_path / "out", tiny_model, task_files["sft_train"], None,
                          train={"max_epochs": 2, "max_steps": 3, "micro_batch_size": 4}))
    status = server.store.get("trainjobs", NS, JOB)["status"]["trainerStatus"]
    metrics = {item["name"]: item["value"] for item in status["metrics"]}
    assert status["progressPercentage"] == 100
    assert (metrics["currentStep"], metrics["totalSteps"], metrics["totalEpochs"]) == ("3", "3", "2")
    assert float(metrics["loss"]) > 0 and float(metrics["tokensPerSecond"]) > 0
