"""The PyTorchJob builder: fields, env, resources, names, CRD validity, and clear errors for bad specs."""

from __future__ import annotations

import pytest

from components.launcher import JobSpec, SecretEnv, build_pytorchjob, derive_job_name
from tests.components.launcher.crd import pytorchjob_validator
from trainer.errors import LaunchError


def gpu_spec(**changes) -> JobSpec:
    values = dict(
        name="af-dpo-0123456789", stage="dpo", config_uri="s3://bucket/run/dpo.yaml", image="alignflow/trainer:1.0",
        namespace="ml", num_nodes=3, nproc_per_node=8, gpus_per_node=8, cpu="32", memory="256Gi",
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


def test_master_and_workers_run_torchrun_in_the_pytorch_container():
    job = build_pytorchjob(gpu_spec())
    replicas = job["spec"]["pytorchReplicaSpecs"]
    assert (job["apiVersion"], job["kind"]) == ("kubeflow.org/v1", "PyTorchJob")
    assert replicas["Master"]["replicas"] == 1 and replicas["Worker"]["replicas"] == 2
    container = replicas["Worker"]["template"]["spec"]["containers"][0]
    assert container["name"] == "pytorch"
    assert container["command"] == ["torchrun", "-m", "trainer", "dpo", "--config", "s3://bucket/run/dpo.yaml"]
    assert job["spec"]["nprocPerNode"] == "8"


def test_resources_placement_and_shared_memory():
    pod = build_pytorchjob(gpu_spec())["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["resources"] == {"requests": {"cpu": "32", "memory": "256Gi", "nvidia.com/gpu": 8},
                                      "limits": {"nvidia.com/gpu": 8}}
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert pod["tolerations"][0]["key"] == "nvidia.com/gpu"
    assert pod["volumes"] == [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "2Gi"}}]
    assert container["volumeMounts"] == [{"name": "dshm", "mountPath": "/dev/shm"}]


def test_plain_env_and_secrets_by_reference_only():
    container = build_pytorchjob(gpu_spec())["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"][
        "containers"][0]
    env = {item["name"]: item for item in container["env"]}
    assert env["MLFLOW_TRACKING_URI"]["value"] == "http://mlflow:5000"
    assert env["AWS_SECRET_ACCESS_KEY"] == {"name": "AWS_SECRET_ACCESS_KEY",
                                            "valueFrom": {"secretKeyRef": {"name": "s3-credentials", "key": "secret-key"}}}


def test_run_policy():
    policy = build_pytorchjob(gpu_spec())["spec"]["runPolicy"]
    assert policy == {"backoffLimit": 2, "cleanPodPolicy": "Running", "activeDeadlineSeconds": 86400,
                      "ttlSecondsAfterFinished": 3600}


def test_single_node_job_has_no_workers():
    replicas = build_pytorchjob(gpu_spec(num_nodes=1, gpus_per_node=0))["spec"]["pytorchReplicaSpecs"]
    assert list(replicas) == ["Master"]
    assert "limits" not in replicas["Master"]["template"]["spec"]["containers"][0]["resources"]


@pytest.mark.parametrize("spec", [gpu_spec(), gpu_spec(num_nodes=1, nproc_per_node="auto", gpus_per_node=0,
                                                       cpu=None, memory=None, node_selector={}, tolerations=[],
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
    ({"stage": "kto"}, "stage is 'kto'"),
    ({"clean_pod_policy": "Sometimes"}, "clean_pod_policy is 'Sometimes'"),
    ({"restart_policy": "Maybe"}, "restart_policy is 'Maybe'"),
    ({"nproc_per_node": 0}, "nproc_per_node is 0"),
    ({"memory": "lots"}, "memory is 'lots'"),
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
        build_pytorchjob(gpu_spec(stage="kto", image=""))
    assert "stage is 'kto'" in str(err.value) and "image is empty" in str(err.value)
