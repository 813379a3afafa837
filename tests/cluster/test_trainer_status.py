"""A running TrainJob shows its progress (KEP-2779) on an emulated Kubeflow Trainer v2.4 with the TrainJobStatus gate.

The pods report through what Trainer injects (tests/cluster/trainer_status.py): one runs alignflow's reporter
(`trainer.tracking.trainjob_status`, as rank 0 of a stage does), one the Kubeflow SDK's own
`update_trainjob_status`, so the emulated endpoint is held to the client upstream ships. The progress is read
from the TrainJob while it runs, as `kubectl get trainjob -o yaml` and the launcher read it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.cluster.apiserver import KUBEFLOW_TRAINER
from tests.cluster.cluster import Cluster, node
from tests.cluster.conftest import IMAGE_USERS
from tests.cluster.test_emulated_trainer import IMAGE, NS, RUNTIME, install_runtime, sdk, train

REPO = str(Path(__file__).parents[2])
REPORTER = """
import time
from trainer.runtime import read_trainjob_status_env
from trainer.tracking.trainjob_status import TrainJobStatusReporter
reporter = TrainJobStatusReporter(read_trainjob_status_env(), min_interval_seconds=0.2)
for step in range(1, 41):
    reporter.log_metrics({"loss": 4.0 - step / 20, "perf/tokens_per_second": 900.0, "progress/epoch": 1.0,
                          "progress/total_epochs": 1.0, "progress/total_steps": 40.0}, step)
    time.sleep(0.1)
reporter.close()
print("sent", reporter.num_sent)
"""
SDK_CALL = """
import sys
from kubeflow.trainer import update_trainjob_status
sys.exit(0 if update_trainjob_status(progress_percent=40, metrics={"loss": 0.5, "episode": 2}) else 1)
"""


@pytest.fixture
def status_cluster(sandbox, tmp_path):
    with Cluster(tmp_path, [node("cpu-0")], image_users=IMAGE_USERS, serves=KUBEFLOW_TRAINER, trainer_status=True,
                 trainer_release="trainer-v2.4") as running:
        install_runtime(running, maxRestarts=0)
        yield running
        assert running.errors == []


def python(code: str) -> str:
    return f"{sys.executable} -c '{code}'"


def trainer_status(cluster: Cluster, name: str) -> dict:
    from kubernetes import client as k8s

    job = k8s.CustomObjectsApi(cluster.client()).get_namespaced_custom_object(
        "trainer.kubeflow.org", "v1alpha1", NS, "trainjobs", name)
    return (job.get("status") or {}).get("trainerStatus") or {}


def test_a_running_trainjob_shows_live_progress(status_cluster):
    client = sdk(status_cluster)
    name = train(client, "progress", python(REPORTER), env={"PYTHONPATH": REPO})
    seen: list[int] = []

    def progress_while_running():
        status = trainer_status(status_cluster, name)
        if "progressPercentage" in status and client.get_job(name).status == "Running":
            seen.append(status["progressPercentage"])
        return len(set(seen)) >= 2

    status_cluster.wait_for(progress_while_running, 60, "two progress values while the job runs")
    job = client.wait_for_job_status(name, timeout=60, polling_interval=1)
    assert job.status == "Complete", list(client.get_job_logs(name))
    assert all(0 <= value < 100 for value in seen) and seen == sorted(seen)  # live, and only forward
    final = trainer_status(status_cluster, name)
    metrics = {item["name"]: item["value"] for item in final["metrics"]}
    assert final["progressPercentage"] == 100 and metrics["currentStep"] == "40" and metrics["loss"] == "2"
    [log] = [line for line in client.get_job_logs(name) if line.startswith("sent ")]
    assert int(log.split()[1]) <= 4 / 0.2 + 1  # 40 steps in 4 s: at most one update per 0.2 s


def test_the_sdks_own_client_is_accepted_and_a_foreign_token_is_not(status_cluster):
    client = sdk(status_cluster)
    name = train(client, "sdk-client", python(SDK_CALL))
    assert client.wait_for_job_status(name, timeout=60, polling_interval=1).status == "Complete"
    status = trainer_status(status_cluster, name)
    assert status["progressPercentage"] == 40
    assert {"name": "loss", "value": "0.5"} in status["metrics"]
    # Least privilege: the pod still has no Kubernetes API token (the chart's runtime); the one token it gets is
    # Trainer's, whose audience is this TrainJob's status endpoint and nothing else.
    [pod] = status_cluster.pods(NS, f"jobset.sigs.k8s.io/jobset-name={name}")
    assert pod["spec"]["automountServiceAccountToken"] is False
    [projected] = [v["projected"] for v in pod["spec"]["volumes"] if "projected" in v]
    [token] = [source["serviceAccountToken"] for source in projected["sources"] if "serviceAccountToken" in source]
    assert token["audience"] == f"trainer.kubeflow.org/v1alpha1/namespaces/{NS}/trainjobs/{name}/status"
    # A token of another job's pod is refused: the endpoint writes only the TrainJob the pod belongs to.
    server = status_cluster.trainer_status
    foreign = server.issue(NS, pod["metadata"]["name"], "trainer.kubeflow.org/v1alpha1/namespaces/team/trainjobs/x/status")
    assert server.authorized(f"Bearer {foreign}", NS, name) is False


def test_the_launchers_trainjobs_are_valid_for_trainer_v2_4(status_cluster):
    from components.launcher.kinds.trainjob.kind import TrainJobKind
    from components.launcher.kinds.trainjob.request import build_trainjob_request
    from components.launcher.pod.spec import JobSpec
    from components.launcher.shared.retry import RetryPolicy

    spec = JobSpec(name="af-dpo-v24", stage="dpo", config_uri="s3://bucket/run/dpo.yaml", image=IMAGE, namespace=NS,
                   nproc_per_node=1, cpu_request="1", memory_limit="1Gi", termination_grace_period_seconds=60,
                   labels={"alignflow/run": "run-1"}, active_deadline_seconds=600)
    kind = TrainJobKind(status_cluster.client(), NS, RUNTIME)
    assert kind.create(build_trainjob_request(spec), RetryPolicy(max_retries=1)) is False  # no 422
    assert status_cluster.api.warnings == []  # nothing pruned by v2.4's schema
    kind.delete(NS, "af-dpo-v24")
