"""The emulated cluster behaves as Kubeflow Trainer v2 does where the launcher relies on it (seconds, no training).

Driven by the Kubeflow SDK's own client (`TrainerClient` with its Kubernetes backend) and the real
`kubernetes` client, as the launcher is; the TrainJobs run on the chart's TrainingRuntime.
"""

from __future__ import annotations

import glob
import json
import os
import uuid

import pytest

from tests.cluster.apiserver import KUBEFLOW_TRAINER, TRAINING_OPERATOR
from tests.cluster.cluster import Cluster, node
from tests.cluster.conftest import IMAGE_USERS, render_chart

NS = "team"
RUNTIME = "af-alignflow-torch"
IMAGE = "ghcr.io/alignflow/trainer:1"


def install_runtime(cluster: Cluster, **runtime_values) -> None:
    """The chart's TrainingRuntime, as a platform team installs it."""
    for manifest in render_chart({"training": {"runtime": runtime_values}}, cluster.api_versions()):
        if manifest["kind"] == "TrainingRuntime":
            cluster.apply(manifest, NS)


@pytest.fixture
def trainer_cluster(sandbox, tmp_path):
    with Cluster(tmp_path, [node("cpu-0")], image_users=IMAGE_USERS, serves=KUBEFLOW_TRAINER) as running:
        install_runtime(running, maxRestarts=1)
        yield running
        assert running.errors == []


def sdk(cluster: Cluster):
    from kubeflow.common.types import KubernetesBackendConfig
    from kubeflow.trainer import TrainerClient

    return TrainerClient(KubernetesBackendConfig(namespace=NS, client_configuration=cluster.client().configuration))


def train(client, name: str, script: str, **trainer):
    from kubeflow.trainer import CustomTrainerContainer
    from kubeflow.trainer.options import Name, TrainerCommand

    return client.train(runtime=RUNTIME, trainer=CustomTrainerContainer(image=IMAGE, **trainer),
                        options=[Name(name), TrainerCommand(["sh", "-c", script])])


def api_error(err: BaseException):
    while err is not None and not hasattr(err, "status"):
        err = err.__cause__
    return err


def test_trainjobs_are_checked_by_the_crd_and_by_trainers_webhook(trainer_cluster):
    from kubernetes import client as k8s

    client = sdk(trainer_cluster)
    with pytest.raises(RuntimeError) as err:  # the torch plugin's variables are Trainer's to set
        train(client, "reserved", "true", env={"PET_NNODES": "4"})
    refused = api_error(err.value)
    assert refused.status == 422 and "must not have reserved envs" in json.loads(refused.body)["message"]
    custom = k8s.CustomObjectsApi(trainer_cluster.client())
    job = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "metadata": {"name": "noruntime"},
           "spec": {"runtimeRef": {"name": "absent", "kind": "TrainingRuntime"}}}
    with pytest.raises(k8s.exceptions.ApiException) as err:
        custom.create_namespaced_custom_object("trainer.kubeflow.org", "v1alpha1", NS, "trainjobs", job)
    assert err.value.status == 422 and "must be created before the TrainJob" in err.value.body
    job["spec"] = {"runtimeRef": {"name": RUNTIME, "kind": "TrainingRuntime"}, "trainer": {"numNodes": "two"}}
    with pytest.raises(k8s.exceptions.ApiException) as err:
        custom.create_namespaced_custom_object("trainer.kubeflow.org", "v1alpha1", NS, "trainjobs", job)
    assert err.value.status == 422 and "spec.trainer.numNodes" in err.value.body


def test_nodes_run_the_trainer_with_the_torch_plugins_environment_and_names(trainer_cluster):
    client = sdk(trainer_cluster)
    script = ("echo rank=$PET_NODE_RANK nodes=$PET_NNODES procs=$PET_NPROC_PER_NODE host=$(hostname) "
              "master=$PET_MASTER_ADDR; getent hosts $PET_MASTER_ADDR")
    name = train(client, "env", script, num_nodes=2)
    job = client.wait_for_job_status(name, timeout=60, polling_interval=1)
    assert job.status == "Complete" and sorted(step.name for step in job.steps) == ["node-0", "node-1"]
    lines = list(client.get_job_logs(name, step="node-1"))
    assert lines[0] == "rank=1 nodes=2 procs=1 host=env-node-0-1 master=env-node-0-0.env"
    assert lines[1].split() == ["127.0.0.2", "env-node-0-0.env"]  # node 0's own address, as a headless Service's


def test_preemption_restarts_every_node_without_counting_and_failures_count(trainer_cluster):
    client = sdk(trainer_cluster)
    # /dev/shm is this machine's: each attempt leaves a file there. Attempts 0 and 1 are preempted (143), 2 and 3
    # fail (1): with maxRestarts 1 the second counted failure fails the TrainJob.
    marker = f"/dev/shm/alignflow-test-{uuid.uuid4().hex[:8]}"
    script = f"n=$(ls {marker}.* 2>/dev/null | wc -l); touch {marker}.$n; [ $n -lt 2 ] && exit 143; exit 1"
    try:
        name = train(client, "policy", script)
        with pytest.raises(RuntimeError, match="is Failed"):
            client.wait_for_job_status(name, timeout=60, polling_interval=1)
        attempts = sorted(glob.glob(f"{marker}.*"))
    finally:
        for path in glob.glob(f"{marker}.*"):
            os.remove(path)
    assert [path.rsplit(".", 1)[1] for path in attempts] == ["0", "1", "2", "3"]
    job = trainer_cluster.store.get("trainjobs", NS, name)
    [failed] = [c for c in job["status"]["conditions"] if c["type"] == "Failed"]
    assert failed["reason"] == "ReachedMaxRestarts" and "BackoffLimitExceeded" in failed["message"]
    state = trainer_cluster.trainer.jobsets[job["metadata"]["uid"]]
    assert (state.attempt, state.restarts) == (3, 1)


def test_deleting_a_trainjob_stops_its_pods(trainer_cluster):
    client = sdk(trainer_cluster)
    name = train(client, "long", "sleep 600")
    trainer_cluster.wait_for(lambda: client.get_job(name).status == "Running", 30, "the TrainJob runs")
    [pod] = trainer_cluster.pods(NS, f"jobset.sigs.k8s.io/jobset-name={name}")
    process = trainer_cluster.kubelet.runtime((NS, pod["metadata"]["name"])).process
    client.delete_job(name)
    trainer_cluster.wait_for(lambda: not trainer_cluster.pods(NS, f"jobset.sigs.k8s.io/jobset-name={name}"), 30,
                             "its pods go")
    assert process.poll() is not None


# serves, runtime installed -> what each ALIGNFLOW_JOB_KIND setting gets: a kind, or the words of its error.
CHOICES = {
    (KUBEFLOW_TRAINER, True): {"auto": "TrainJob", "trainjob": "TrainJob",
                               "pytorchjob": "does not serve kubeflow.org/v1 pytorchjobs"},
    (KUBEFLOW_TRAINER, False): {"auto": "no kind of training job can run here",
                                "trainjob": f"runtime '{RUNTIME}' exists neither as a TrainingRuntime in namespace team"},
    (TRAINING_OPERATOR | KUBEFLOW_TRAINER, True): {"auto": "TrainJob"},
    (TRAINING_OPERATOR | KUBEFLOW_TRAINER, False): {"auto": "PyTorchJob"},
    (TRAINING_OPERATOR, False): {"auto": "PyTorchJob", "pytorchjob": "PyTorchJob",
                                 "trainjob": "does not serve trainer.kubeflow.org/v1alpha1 trainjobs (is Kubeflow "
                                             "Trainer v2 installed?)"},
}


def test_the_job_kind_follows_what_the_cluster_serves(sandbox, tmp_path, caplog):
    """What `ALIGNFLOW_JOB_KIND` chooses on each kind of cluster, before anything is created; discovery needs no
    RBAC rule."""
    from components.launcher.kinds.choice import choose_job_kind
    from trainer.errors import LaunchError

    for number, ((serves, runtime), expectations) in enumerate(CHOICES.items()):
        with Cluster(tmp_path / str(number), [], serves=serves) as cluster:
            if runtime:
                install_runtime(cluster)
            api_client = cluster.client()
            for setting, expected in expectations.items():
                case = f"{sorted(serves)}, runtime {runtime}, {setting}"
                if expected in ("TrainJob", "PyTorchJob"):
                    caplog.clear()
                    with caplog.at_level("INFO", logger="components.launcher.kinds.choice"):
                        assert choose_job_kind(api_client, NS, setting, RUNTIME).kind == expected, case
                    assert f"job kind: {expected} (ALIGNFLOW_JOB_KIND={setting}" in caplog.text, case
                else:
                    with pytest.raises(LaunchError) as err:
                        choose_job_kind(api_client, NS, setting, RUNTIME)
                    assert expected in str(err.value), case
                    assert f"job kind {setting} (ALIGNFLOW_JOB_KIND)" in str(err.value), case
            assert cluster.api.calls("create") == []

def launcher_for(cluster: Cluster):
    from components.launcher.follow.launcher import KubernetesLauncher
    from components.launcher.kinds.trainjob.kind import TrainJobKind

    api_client = cluster.client()
    return KubernetesLauncher(api_client, kind=TrainJobKind(api_client, NS, RUNTIME), poll_seconds=0.5)


def shell_request(name: str, script: str, *options):
    """What `build_trainjob_request` returns, with a shell standing in for the trainer."""
    from kubeflow.trainer import CustomTrainerContainer
    from kubeflow.trainer.options import Labels, Name, TrainerCommand

    from components.launcher.kinds.trainjob.request import TrainJobRequest

    return TrainJobRequest(NS, name, CustomTrainerContainer(image=IMAGE),
                           [Name(name), Labels({"alignflow/run": "run-1"}), TrainerCommand(["sh", "-c", script]),
                            *options])


def test_the_launcher_reports_why_a_trainjob_failed_with_its_trainers_last_lines(trainer_cluster):
    from trainer.errors import LaunchError

    launcher = launcher_for(trainer_cluster)
    with pytest.raises(LaunchError) as err:
        launcher.run(shell_request("fails", "echo loading; echo 'ValueError: bad row 7'; exit 3"), timeout=60)
    message = str(err.value)
    assert message.startswith(f"TrainJob {NS}/fails failed (ReachedMaxRestarts: ")
    assert message.endswith("last lines of its trainer:\nloading\nValueError: bad row 7")  # the SDK's get_job_logs
    assert trainer_cluster.jobs(resource="trainjobs") == []  # deleted when it ended


def test_a_trainjob_past_its_active_deadline_fails_and_a_retried_task_reattaches(trainer_cluster):
    from kubeflow.trainer.options import ActiveDeadlineSeconds

    from trainer.errors import LaunchError

    launcher = launcher_for(trainer_cluster)
    request = shell_request("deadline", "sleep 600", ActiveDeadlineSeconds(2))
    assert launcher.create(request) is False
    assert launcher.create(request) is True  # a retried KFP task: 409, the same TrainJob
    with pytest.raises(LaunchError, match="failed \\(DeadlineExceeded: TrainJob exceeded its active deadline\\)"):
        launcher.run(request, timeout=60)
    assert launcher.delete_run_jobs(NS, "run-1") == []  # the launcher deleted it; the exit handler finds none
