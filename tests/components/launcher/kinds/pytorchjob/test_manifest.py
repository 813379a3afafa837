"""The PyTorchJob builder: fields, env, resources, placement, security, elastic rendezvous, names, CRD
validity, and clear errors for bad specs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from components.launcher.kinds.pytorchjob.manifest import build_pytorchjob
from components.launcher.pod.spec import JobSpec, SecretEnv, derive_job_name
from tests.components.launcher.crd import pytorchjob_validator
from tests.components.launcher.pod_security import violations
from trainer.errors import LaunchError


def gpu_spec(**changes) -> JobSpec:
    values = dict(
        name="af-dpo-0123456789", stage="dpo", config_uri="s3://bucket/run/dpo.yaml", image="alignflow/trainer:1.0",
        namespace="ml", num_nodes=3, nproc_per_node=8, gpus_per_node=8, cpu_request="32", memory_request="256Gi",
        node_selector={"nvidia.com/gpu.present": "true"},
        tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        env={"MLFLOW_TRACKING_URI": "http://mlflow:5000", "ALIGNFLOW_PIPELINE_RUN_ID": "run-1"},
        secret_env=[SecretEnv("AWS_ACCESS_KEY_ID", "s3-credentials", "access-key"),
                    SecretEnv("AWS_SECRET_ACCESS_KEY", "s3-credentials", "secret-key")],
        active_deadline_seconds=86400, clean_pod_policy="Running",
    )
    values.update(changes)
    return JobSpec(**values)


@pytest.fixture(scope="module")
def validator():
    return pytorchjob_validator()


def replica_pod(job: dict) -> dict:
    (replica,) = job["spec"]["pytorchReplicaSpecs"].values()
    return replica["template"]["spec"]


def test_single_node_job_is_one_master_running_torchrun_through_trainer_launch_in_the_pytorch_container():
    job = build_pytorchjob(gpu_spec(num_nodes=1))
    replicas = job["spec"]["pytorchReplicaSpecs"]
    assert (job["apiVersion"], job["kind"]) == ("kubeflow.org/v1", "PyTorchJob")
    assert list(replicas) == ["Master"] and replicas["Master"]["replicas"] == 1
    assert "elasticPolicy" not in job["spec"]
    container = replicas["Master"]["template"]["spec"]["containers"][0]
    assert container["name"] == "pytorch"
    # trainer.launch is torchrun exiting 143 (not 1) when preempted (tests/trainer/test_launch.py).
    assert container["command"] == ["python", "-m", "trainer.launch", "-m", "trainer", "dpo", "--config",
                                    "s3://bucket/run/dpo.yaml"]
    assert job["spec"]["nprocPerNode"] == "8"


def test_multi_node_job_is_elastic_so_a_restarted_worker_rejoins():
    job = build_pytorchjob(gpu_spec(num_nodes=3, max_restarts=5))
    # The operator's webhook requires Worker replicas with an elastic policy; worker-0 hosts the c10d rendezvous.
    assert list(job["spec"]["pytorchReplicaSpecs"]) == ["Worker"]
    assert job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 3
    assert job["spec"]["elasticPolicy"] == {"rdzvBackend": "c10d", "rdzvId": "af-dpo-0123456789", "minReplicas": 3,
                                            "maxReplicas": 3, "maxRestarts": 5}
    container = replica_pod(job)["containers"][0]
    env = {item["name"]: item.get("value") for item in container["env"]}
    assert env["PET_NPROC_PER_NODE"] == "8"  # the operator sets it only when a Master exists
    assert {"name": "pytorchjob-port", "containerPort": 23456, "protocol": "TCP"} in container["ports"]


def test_resources_placement_and_shared_memory():
    pod = replica_pod(build_pytorchjob(gpu_spec()))
    container = pod["containers"][0]
    assert container["resources"] == {"requests": {"cpu": "32", "memory": "256Gi", "nvidia.com/gpu": 8},
                                      "limits": {"nvidia.com/gpu": 8}}
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert pod["tolerations"][0]["key"] == "nvidia.com/gpu"
    assert pod["volumes"] == [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "2Gi"}}]
    assert container["volumeMounts"] == [{"name": "dshm", "mountPath": "/dev/shm"}]
    assert pod["terminationGracePeriodSeconds"] == 30


AFFINITY = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
    {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-H100-80GB-HBM3"]}]}]}},
    "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100, "podAffinityTerm": {
        "topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"alignflow/stage": "dpo"}}}}]}}


def test_every_scheduling_option_reaches_the_job(validator):
    job = build_pytorchjob(gpu_spec(
        gpu_resource="nvidia.com/mig-3g.40gb", gpus_per_node=2, cpu_request="16", cpu_limit="32",
        memory_request="128Gi", memory_limit="256Gi", shm_size="32Gi", affinity=AFFINITY,
        service_account="alignflow-trainer", priority_class="training-high", kueue_queue="team-ml",
        active_deadline_seconds=7200, termination_grace_period_seconds=120))
    validator.validate(job)
    pod = replica_pod(job)
    assert pod["containers"][0]["resources"] == {
        "requests": {"cpu": "16", "memory": "128Gi", "nvidia.com/mig-3g.40gb": 2},
        "limits": {"cpu": "32", "memory": "256Gi", "nvidia.com/mig-3g.40gb": 2}}
    assert pod["volumes"][0]["emptyDir"] == {"medium": "Memory", "sizeLimit": "32Gi"}
    assert pod["affinity"] == AFFINITY
    assert (pod["serviceAccountName"], pod["priorityClassName"]) == ("alignflow-trainer", "training-high")
    assert pod["terminationGracePeriodSeconds"] == 120
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-ml"
    assert job["spec"]["runPolicy"]["activeDeadlineSeconds"] == 7200


@pytest.mark.parametrize("num_nodes", [1, 3])
def test_every_replica_pod_meets_the_restricted_pod_security_standard(num_nodes, validator):
    import kubernetes_validate

    job = build_pytorchjob(gpu_spec(num_nodes=num_nodes))
    validator.validate(job)
    for replica in job["spec"]["pytorchReplicaSpecs"].values():
        pod = replica["template"]["spec"]
        assert violations(pod) == []
        assert pod["securityContext"] == {"runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 1000,
                                          "fsGroup": 1000, "seccompProfile": {"type": "RuntimeDefault"}}
        assert pod["containers"][0]["securityContext"] == {
            "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}, "runAsNonRoot": True}
        assert pod["automountServiceAccountToken"] is False
        # The pod the operator creates from this template is a valid core/v1 Pod (strict schema).
        kubernetes_validate.validate({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": pod},
                                     "1.30.0", strict=True)


def test_the_restricted_checker_catches_a_root_privileged_pod():
    pod = replica_pod(build_pytorchjob(gpu_spec(num_nodes=1)))
    pod["securityContext"]["runAsUser"] = 0
    pod["containers"][0]["securityContext"] = {"privileged": True}
    pod["volumes"].append({"name": "host", "hostPath": {"path": "/"}})
    problems = "\n".join(violations(pod))
    for expected in ("runAsUser is 0", "privileged is true", "hostPath", "allowPrivilegeEscalation",
                     "capabilities.drop"):
        assert expected in problems


def test_user_and_group_follow_the_image():
    pod = replica_pod(build_pytorchjob(gpu_spec(num_nodes=1, run_as_user=2000, run_as_group=3000)))
    assert pod["securityContext"]["runAsUser"] == 2000
    assert pod["securityContext"]["runAsGroup"] == pod["securityContext"]["fsGroup"] == 3000


def test_default_user_is_the_trainer_images_user():
    dockerfile = (Path(__file__).parents[5] / "images" / "trainer" / "Dockerfile").read_text()
    uid = int(re.search(r"useradd[^\n]*--uid (\d+)", dockerfile).group(1))
    assert re.search(rf"^USER {uid}$", dockerfile, re.MULTILINE)
    spec = gpu_spec()
    assert spec.run_as_user == spec.run_as_group == uid


def test_plain_env_and_secrets_by_reference_only():
    container = replica_pod(build_pytorchjob(gpu_spec(
        secret_env=[SecretEnv("AWS_SECRET_ACCESS_KEY", "s3-credentials", "secret-key"),
                    SecretEnv("MLFLOW_TRACKING_TOKEN", "mlflow-credentials", "MLFLOW_TRACKING_TOKEN", optional=True)],
    )))["containers"][0]
    env = {item["name"]: item for item in container["env"]}
    assert env["MLFLOW_TRACKING_URI"]["value"] == "http://mlflow:5000"
    assert env["AWS_SECRET_ACCESS_KEY"] == {"name": "AWS_SECRET_ACCESS_KEY",
                                            "valueFrom": {"secretKeyRef": {"name": "s3-credentials", "key": "secret-key"}}}
    assert env["MLFLOW_TRACKING_TOKEN"]["valueFrom"]["secretKeyRef"] == {
        "name": "mlflow-credentials", "key": "MLFLOW_TRACKING_TOKEN", "optional": True}


def test_a_url_with_a_password_is_refused_as_a_plain_value_without_echoing_it():
    with pytest.raises(LaunchError, match="env MLFLOW_TRACKING_URI is a URL with a password") as err:
        build_pytorchjob(gpu_spec(env={"MLFLOW_TRACKING_URI": "https://bob:hunter2@mlflow.example.com"}))
    assert "hunter2" not in str(err.value)


def test_run_policy():
    policy = build_pytorchjob(gpu_spec())["spec"]["runPolicy"]
    assert policy == {"backoffLimit": 2, "cleanPodPolicy": "Running", "activeDeadlineSeconds": 86400,
                      "ttlSecondsAfterFinished": 3600}


def test_cpu_only_job_requests_no_gpus():
    pod = replica_pod(build_pytorchjob(gpu_spec(num_nodes=1, gpus_per_node=0, cpu_request=None, memory_request=None)))
    assert pod["containers"][0]["resources"] == {}


@pytest.mark.parametrize("spec", [gpu_spec(), gpu_spec(num_nodes=1, nproc_per_node="auto", gpus_per_node=0,
                                                       cpu_request=None, memory_request=None, node_selector={},
                                                       tolerations=[],
                                                       secret_env=[], active_deadline_seconds=None)])
def test_manifests_validate_against_the_crd_schema(spec, validator):
    validator.validate(build_pytorchjob(spec))


def test_the_validator_catches_a_misspelled_field(validator):
    from jsonschema.exceptions import ValidationError

    job = build_pytorchjob(gpu_spec())
    job["spec"]["runPolicy"]["backofLimit"] = 3
    with pytest.raises(ValidationError):
        validator.validate(job)


def test_job_name_is_stable_per_run_and_task_and_a_dns_label():
    name = derive_job_name("b2f4c7d0-run", "Train DPO (stage 2)")
    assert name == derive_job_name("b2f4c7d0-run", "Train DPO (stage 2)")
    assert name != derive_job_name("another-run", "Train DPO (stage 2)")
    assert name.startswith("af-train-dpo-stage-2-") and len(name) <= 63
    assert len(derive_job_name("r", "x" * 200)) <= 63


@pytest.mark.parametrize(("changes", "message"), [
    ({"stage": "cpo"}, "stage is 'cpo'"),
    ({"clean_pod_policy": "Sometimes"}, "clean_pod_policy is 'Sometimes'"),
    ({"restart_policy": "Maybe"}, "restart_policy is 'Maybe'"),
    ({"nproc_per_node": 0}, "nproc_per_node is 0"),
    ({"memory_request": "lots"}, "memory_request is 'lots'"),
    ({"cpu_request": "4", "cpu_limit": "500m"}, "cpu_request '4' is above cpu_limit '500m'"),
    ({"memory_request": "2Gi", "memory_limit": "2000Mi"}, "memory_request '2Gi' is above memory_limit '2000Mi'"),
    ({"gpu_resource": "gpu"}, "gpu_resource is 'gpu'"),
    ({"run_as_user": 0}, "run_as_user is 0, expected >= 1"),
    ({"kueue_queue": "team ml"}, "kueue_queue is 'team ml'"),
    ({"priority_class": "High_Priority"}, "priority_class is 'High_Priority'"),
    ({"tolerations": [{"key": "k", "operator": "Matches"}]}, r"tolerations\[0\].operator is 'Matches'"),
    ({"tolerations": [{"key": "k", "operator": "Exists", "effect": "NoRun"}]}, r"tolerations\[0\].effect is 'NoRun'"),
    ({"name": "1-starts-with-a-digit"}, "not a DNS-1035 label"),
    ({"name": "Bad_Name"}, "name 'Bad_Name'"),
    ({"image": ""}, "image is empty"),
    ({"active_deadline_seconds": 0}, "active_deadline_seconds is 0"),
    ({"secret_env": [SecretEnv("AWS_ACCESS_KEY_ID", "", "k")]}, "needs name, secret and key"),
])
def test_bad_specs_are_rejected_with_the_field_named(changes, message):
    with pytest.raises(LaunchError, match=message):
        build_pytorchjob(gpu_spec(**changes))


def test_every_problem_is_reported_at_once():
    with pytest.raises(LaunchError) as err:
        build_pytorchjob(gpu_spec(stage="cpo", image=""))
    assert "stage is 'cpo'" in str(err.value) and "image is empty" in str(err.value)
