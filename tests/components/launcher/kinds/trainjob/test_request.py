"""What the launcher hands the Kubeflow SDK for a TrainJob: the trainer, its options, and the errors before any call.

The TrainJob these become (through `TrainerClient.train`) is validated against the TrainJob CRD and
Trainer's webhook by the emulated cluster (tests/cluster/test_pipeline_run.py, test_multi_node.py).
"""

from __future__ import annotations

import pytest

from components.launcher.kinds.trainjob.request import PodFields, build_trainjob_request
from components.launcher.pod.spec import JobSpec, SecretEnv
from trainer.errors import LaunchError


def spec(**changes) -> JobSpec:
    values = dict(
        name="af-dpo-0123456789", stage="dpo", config_uri="s3://bucket/run/dpo.yaml", image="alignflow/trainer:1.0",
        namespace="ml", num_nodes=2, nproc_per_node=8, gpus_per_node=8, cpu_request="32", memory_limit="256Gi",
        node_selector={"nvidia.com/gpu.present": "true"}, kueue_queue="gpu", termination_grace_period_seconds=100,
        tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        env={"MLFLOW_TRACKING_URI": "http://mlflow:5000"}, labels={"alignflow/run": "run-1"},
        secret_env=[SecretEnv("AWS_ACCESS_KEY_ID", "s3-credentials", "access-key"),
                    SecretEnv("AWS_SECRET_ACCESS_KEY", "s3-credentials", "secret-key"),
                    SecretEnv("MLFLOW_TRACKING_TOKEN", "mlflow", "MLFLOW_TRACKING_TOKEN", optional=True)],
        active_deadline_seconds=86400)
    values.update(changes)
    return JobSpec(**values)


def options_of(request) -> dict[str, object]:
    return {type(option).__name__: option for option in request.options}


def test_the_trainer_runs_the_stage_with_its_processes_per_node_given_to_torchrun():
    request = build_trainjob_request(spec())
    command = options_of(request)["TrainerCommand"].command
    # The SDK cannot set trainer.numProcPerNode (the torch plugin would start one process per requested CPU).
    assert command == ["python", "-m", "trainer.launch", "--nproc-per-node", "8", "-m", "trainer", "dpo",
                       "--config", "s3://bucket/run/dpo.yaml"]
    trainer = request.trainer
    assert (trainer.image, trainer.num_nodes) == ("alignflow/trainer:1.0", 2)
    # Requests equal limits through the SDK: a request alone or a limit alone becomes both.
    assert trainer.resources_per_node == {"cpu": "32", "memory": "256Gi", "nvidia.com/gpu": "8"}
    assert options_of(request)["Labels"].labels == {"app.kubernetes.io/name": "alignflow", "alignflow/stage": "dpo",
                                                    "alignflow/run": "run-1", "kueue.x-k8s.io/queue-name": "gpu"}
    assert options_of(request)["ActiveDeadlineSeconds"].seconds == 86400
    assert (request.namespace, request.name, options_of(request)["Name"].name) == ("ml", "af-dpo-0123456789",
                                                                                   "af-dpo-0123456789")


def test_secrets_reach_the_trainer_as_files_of_secret_volumes_never_as_values():
    request = build_trainjob_request(spec())
    env = request.trainer.env
    assert env["ALIGNFLOW_SECRET_ENV_DIRS"] == ("/var/run/secrets/alignflow/s3-credentials:"
                                                "/var/run/secrets/alignflow/mlflow-optional")
    assert not {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "MLFLOW_TRACKING_TOKEN"} & set(env)
    pod = options_of(request)["RuntimePatch"].training_runtime_spec.template.spec.replicated_jobs[0] \
        .template.spec.template.spec
    volumes = {volume["name"]: volume for volume in pod.volumes}
    assert volumes["secret-env-0"]["secret"] == {"secretName": "s3-credentials", "items": [
        {"key": "access-key", "path": "AWS_ACCESS_KEY_ID"}, {"key": "secret-key", "path": "AWS_SECRET_ACCESS_KEY"}]}
    assert volumes["secret-env-1"]["secret"]["optional"] is True  # a missing MLflow Secret leaves it unset
    assert volumes["dshm"] == {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "2Gi"}}
    [node] = pod.containers
    assert node.name == "node" and {"name": "secret-env-0", "mountPath": "/var/run/secrets/alignflow/s3-credentials",
                                     "readOnly": True} in node.volume_mounts
    assert node.security_context == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                                     "runAsNonRoot": True}
    assert pod.node_selector == {"nvidia.com/gpu.present": "true"} and pod.security_context["runAsUser"] == 1000


def test_the_grace_period_is_a_runtime_patch_of_our_own():
    job_spec: dict = {}
    grace = options_of(build_trainjob_request(spec()))["PodFields"]
    assert isinstance(grace, PodFields) and grace.fields == {"terminationGracePeriodSeconds": 100}
    grace(job_spec, None, None)
    [patch] = job_spec["spec"]["runtimePatches"]
    assert patch["manager"] == "alignflow.dev/launcher"
    [job] = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    assert job == {"name": "node", "template": {"spec": {"template": {"spec": {"terminationGracePeriodSeconds": 100}}}}}


@pytest.mark.parametrize(("changes", "message"), [
    ({"cpu_request": "4", "cpu_limit": "8"}, "cpu_request '4' differs from cpu_limit '8'"),
    ({"env": {"PET_MASTER_PORT": "1"}}, "env PET_MASTER_PORT is set by Kubeflow Trainer's torch plugin"),
    ({"name": "Bad_Name"}, "name 'Bad_Name' is not a DNS-1035 label"),
])
def test_what_a_trainjob_cannot_take_is_refused_before_any_call(changes, message):
    with pytest.raises(LaunchError, match=r"^TrainJob ") as err:
        build_trainjob_request(spec(**changes))
    assert message in str(err.value)
