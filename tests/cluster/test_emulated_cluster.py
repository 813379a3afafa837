"""The emulated cluster behaves as a real one where the end-to-end tests rely on it (seconds, no training).

Each test talks to it through the real `kubernetes` client, as the launcher does.
"""

from __future__ import annotations

import json
import os
import time
import uuid

import pytest

from tests.cluster.cluster import Cluster, node

NS = "team"
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def job(name: str, command: list[str], *, env: list[dict] | None = None, gpus: int = 0, restart: str = "Never",
        backoff_limit: int = 0, tolerations: list[dict] | None = None, **extra_spec) -> dict:
    container = {"name": "pytorch", "image": "ghcr.io/alignflow/trainer:1", "command": command, "env": env or []}
    if gpus:
        container["resources"] = {"limits": {"nvidia.com/gpu": gpus}}
    pod_spec = {"containers": [container], **({"tolerations": tolerations} if tolerations else {})}
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": name, "namespace": NS},
            "spec": {"nprocPerNode": "1", "runPolicy": {"backoffLimit": backoff_limit},
                     "pytorchReplicaSpecs": {"Master": {"replicas": 1, "restartPolicy": restart,
                                                        "template": {"spec": pod_spec}}}, **extra_spec}}


@pytest.fixture
def cluster(sandbox, tmp_path):
    nodes = [node("cpu-0"), node("gpu-0", gpus=1, taints=[GPU_TAINT])]
    with Cluster(tmp_path, nodes, image_users={"ghcr.io/alignflow/": (1000, 1000, "/home/alignflow")}) as running:
        yield running
        assert running.errors == []


@pytest.fixture
def apis(cluster):
    from kubernetes import client

    api_client = cluster.client()
    return client.CustomObjectsApi(api_client), client.CoreV1Api(api_client)


def phase(cluster, name: str) -> str | None:
    jobs = [j for j in cluster.jobs(NS) if j["metadata"]["name"] == name]
    conditions = [c for c in (jobs[0].get("status") or {}).get("conditions", []) if c["status"] == "True"] if jobs else []
    return conditions[-1]["type"] if conditions else None


def test_schema_violations_are_422_and_unknown_fields_are_pruned_with_a_warning(cluster, apis):
    from kubernetes.client.exceptions import ApiException

    custom, _ = apis
    bad = job("bad", ["true"])
    bad["spec"]["pytorchReplicaSpecs"]["Master"]["replicas"] = "one"
    with pytest.raises(ApiException) as err:
        custom.create_namespaced_custom_object("kubeflow.org", "v1", NS, "pytorchjobs", bad)
    assert err.value.status == 422 and "spec.pytorchReplicaSpecs.Master.replicas" in err.value.body
    typo = job("typo", ["true"])
    typo["spec"]["runPolicy"]["backofLimit"] = 3
    created = custom.create_namespaced_custom_object("kubeflow.org", "v1", NS, "pytorchjobs", typo)
    assert "backofLimit" not in created["spec"]["runPolicy"]
    assert cluster.api.warnings == ["spec.runPolicy.backofLimit"]


def test_resource_versions_conflicts_and_expired_watches(cluster, apis):
    from kubernetes import watch
    from kubernetes.client.exceptions import ApiException

    custom, _ = apis
    first = custom.create_namespaced_custom_object("kubeflow.org", "v1", NS, "pytorchjobs", job("a", ["sleep", "30"]))
    cluster.wait_for(lambda: phase(cluster, "a") == "Running", 30, "job a runs")
    stale = dict(first, metadata={**first["metadata"]})
    with pytest.raises(ApiException) as err:
        custom.replace_namespaced_custom_object("kubeflow.org", "v1", NS, "pytorchjobs", "a", stale)
    assert err.value.status == 409
    cluster.store.compact()
    with pytest.raises(ApiException) as err:
        for _ in watch.Watch().stream(custom.list_namespaced_custom_object, "kubeflow.org", "v1", NS, "pytorchjobs",
                                      resource_version=first["metadata"]["resourceVersion"], timeout_seconds=5):
            pass
    assert err.value.status == 410


def test_rbac_refuses_what_a_service_account_was_not_granted(cluster):
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    token = cluster.issue_token(NS, "runner")
    cluster.apply({"kind": "Role", "metadata": {"name": "pods"}, "rules": [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]}, NS)
    cluster.apply({"kind": "RoleBinding", "metadata": {"name": "pods"}, "roleRef": {"kind": "Role", "name": "pods"},
                   "subjects": [{"kind": "ServiceAccount", "name": "runner"}]}, NS)
    as_runner = cluster.client(token)
    client.CoreV1Api(as_runner).list_namespaced_pod(NS)
    with pytest.raises(ApiException) as err:
        client.CustomObjectsApi(as_runner).create_namespaced_custom_object("kubeflow.org", "v1", NS, "pytorchjobs",
                                                                           job("x", ["true"]))
    assert err.value.status == 403
    message = json.loads(err.value.body)["message"]
    assert message == (f'pytorchjobs.kubeflow.org is forbidden: User "system:serviceaccount:{NS}:runner" cannot create '
                       f'resource "pytorchjobs" in API group "kubeflow.org" in the namespace "{NS}"')


def test_a_pod_that_fits_no_node_stays_pending_with_the_schedulers_reason(cluster, apis):
    custom, core = apis
    custom.create_namespaced_custom_object("kubeflow.org", "v1", NS, "pytorchjobs", job("big", ["true"], gpus=2,
                                                                                              tolerations=[GPU_TOLERATION]))
    custom.create_namespaced_custom_object("kubeflow.org", "v1", NS, "pytorchjobs", job("untolerated", ["true"], gpus=1))

    def reason(name: str) -> str:
        pods = core.list_namespaced_pod(NS, label_selector=f"training.kubeflow.org/job-name={name}").items
        conditions = pods[0].status.conditions or [] if pods else []
        return next((c.message for c in conditions if c.type == "PodScheduled" and c.status == "False"), "")

    assert "0/2 nodes are available: 2 Insufficient nvidia.com/gpu." in cluster.wait_for(
        lambda: reason("big"), 20, "big is unschedulable")
    assert "1 node(s) had untolerated taint {nvidia.com/gpu: present}" in cluster.wait_for(
        lambda: reason("untolerated"), 20, "untolerated is unschedulable")
    events = core.list_namespaced_event(NS).items
    assert any(e.reason == "FailedScheduling" and e.involved_object.name == "big-master-0" for e in events)
    assert phase(cluster, "big") == "Created"


def test_replicas_run_the_manifest_command_with_the_operator_env_and_resolved_secrets(cluster, apis):
    custom, core = apis
    cluster.create_namespace_objects(NS, secrets_={"s3": {"KEY": "from-the-secret"}})
    env = [{"name": "PLAIN", "value": "1"}, {"name": "KEY", "valueFrom": {"secretKeyRef": {"name": "s3", "key": "KEY"}}}]
    script = "id -u; pwd; ls -A; echo KEY=$KEY; echo RANK=$RANK MASTER_ADDR=$MASTER_ADDR; getent hosts $MASTER_ADDR"
    custom.create_namespaced_custom_object("kubeflow.org", "v1", NS, "pytorchjobs", job("env", ["sh", "-c", script],
                                                                                        env=env))
    cluster.wait_for(lambda: phase(cluster, "env") == "Succeeded", 30, "job env succeeds")
    log = core.read_namespaced_pod_log("env-master-0", NS, container="pytorch").splitlines()
    assert log[:3] == ["1000", "/workspace", "KEY=from-the-secret"]  # the image's user, an empty directory
    assert log[3] == "RANK=0 MASTER_ADDR=env-master-0" and log[4].split() == ["127.0.0.2", "env-master-0"]  # the replica's own loopback address


def test_missing_secret_keeps_the_pod_waiting_with_the_kubelets_message(cluster, apis):
    custom, core = apis
    env = [{"name": "KEY", "valueFrom": {"secretKeyRef": {"name": "absent", "key": "KEY"}}}]
    custom.create_namespaced_custom_object("kubeflow.org", "v1", NS, "pytorchjobs", job("nokey", ["true"], env=env))

    def waiting():
        pods = core.list_namespaced_pod(NS, label_selector="training.kubeflow.org/job-name=nokey").items
        statuses = pods[0].status.container_statuses if pods else None
        return statuses[0].state.waiting if statuses else None

    state = cluster.wait_for(waiting, 20, "the container waits")
    assert (state.reason, state.message) == ("CreateContainerConfigError", 'secret "absent" not found')


def test_failed_replica_fails_the_job_and_deleting_a_job_stops_its_pods(cluster, apis):
    custom, core = apis
    custom.create_namespaced_custom_object("kubeflow.org", "v1", NS, "pytorchjobs", job("fails", ["sh", "-c", "exit 3"]))
    cluster.wait_for(lambda: phase(cluster, "fails") == "Failed", 30, "job fails fails")
    custom.create_namespaced_custom_object("kubeflow.org", "v1", NS, "pytorchjobs", job("long", ["sleep", "600"]))
    cluster.wait_for(lambda: phase(cluster, "long") == "Running", 30, "job long runs")
    process = cluster.kubelet.runtime((NS, "long-master-0")).process
    custom.delete_namespaced_custom_object("kubeflow.org", "v1", NS, "pytorchjobs", "long")
    cluster.wait_for(lambda: not cluster.pods(NS, "training.kubeflow.org/job-name=long"), 30, "its pod goes")
    assert process.poll() is not None


def test_pod_log_follows_since_and_tail_with_timestamps(cluster, apis):
    custom, core = apis
    script = "for i in 1 2 3 4 5; do echo line $i; sleep 0.3; done"
    custom.create_namespaced_custom_object("kubeflow.org", "v1", NS, "pytorchjobs", job("logs", ["sh", "-c", script]))
    cluster.wait_for(lambda: phase(cluster, "logs") == "Running", 30, "job logs runs")
    response = core.read_namespaced_pod_log("logs-master-0", NS, container="pytorch", follow=True,
                                            _preload_content=False)
    followed = response.data.decode().splitlines()
    assert followed == [f"line {i}" for i in range(1, 6)]
    time.sleep(1.5)
    stamped = core.read_namespaced_pod_log("logs-master-0", NS, container="pytorch", timestamps=True, tail_lines=2)
    assert [line.split(" ", 1)[1] for line in stamped.splitlines()] == ["line 4", "line 5"]
    assert stamped.split(" ", 1)[0].endswith("Z")
    assert core.read_namespaced_pod_log("logs-master-0", NS, container="pytorch", since_seconds=1) == ""


def test_an_evicted_replica_is_recreated_and_its_preemption_is_not_a_failure(cluster, apis):
    """A preempted PyTorchJob replica (eviction: SIGTERM, the trainer's checkpoint, exit 143) comes back as a new pod
    of the same name, and the job still succeeds within a backoffLimit of 0."""
    custom, _ = apis
    marker = f"/dev/shm/alignflow-test-{uuid.uuid4().hex[:8]}"  # this machine's: the second pod finds it
    script = (f'trap "echo preempted; exit 143" TERM; if [ -e {marker} ]; then echo resumed; exit 0; fi; '
              f"touch {marker}; echo started; while true; do sleep 0.1; done")
    try:
        custom.create_namespaced_custom_object("kubeflow.org", "v1", NS, "pytorchjobs",
                                               job("evicted", ["sh", "-c", script], restart="OnFailure"))
        cluster.wait_for(lambda: os.path.exists(marker), 30, "the first pod runs")
        cluster.evict(NS, "evicted-master-0")
        cluster.wait_for(lambda: phase(cluster, "evicted") == "Succeeded", 60, "the job succeeds")
    finally:
        if os.path.exists(marker):
            os.remove(marker)
    first = cluster.kubelet.removed[(NS, "evicted-master-0")]
    assert first.process.returncode == 143 and first.log.lines[-1] == "preempted"
    assert cluster.kubelet.runtime((NS, "evicted-master-0")).log.lines == ["resumed"]  # the recreated pod
