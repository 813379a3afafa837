"""The defaults ConfigMap: platform settings and allow-lists under environment-variable names."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.helm.chart import containers, one, pods, render

KEYS = {"ALIGNFLOW_DEFAULTS_CONFIGMAP", "ALIGNFLOW_MLFLOW_SECRET", "ALIGNFLOW_MLFLOW_TOKEN_AUDIENCE", "ALIGNFLOW_LAUNCHER_IMAGE", "ALIGNFLOW_TRAINER_IMAGE", "ALIGNFLOW_TRAINER_VLLM_IMAGE", "ALIGNFLOW_SERVICE_ACCOUNT", "ALIGNFLOW_PIPELINE_ROOT",
        "ALIGNFLOW_S3_BUCKET", "ALIGNFLOW_S3_SECRET", "AWS_ENDPOINT_URL", "AWS_DEFAULT_REGION", "MLFLOW_TRACKING_URI",
        "ALIGNFLOW_MLFLOW_EXTERNAL_URL", "KFP_HOST", "KFP_NAMESPACE", "ALIGNFLOW_NODE_SELECTOR",
        "ALIGNFLOW_TOLERATIONS", "ALIGNFLOW_GPU_RESOURCE", "ALIGNFLOW_PRIORITY_CLASS", "ALIGNFLOW_KUEUE_QUEUE",
        "ALIGNFLOW_ALLOWED_IMAGES", "ALIGNFLOW_ALLOWED_SECRETS", "ALIGNFLOW_REWARD_FUNCTIONS",
        "ALIGNFLOW_ALLOWED_REWARD_MODULES", "ALIGNFLOW_ENVIRONMENTS", "ALIGNFLOW_ALLOWED_ENVIRONMENT_MODULES",
        "ALIGNFLOW_TOOLS", "ALIGNFLOW_ALLOWED_TOOL_MODULES", "ALIGNFLOW_AFFINITY", "ALIGNFLOW_CPU_REQUEST", "ALIGNFLOW_CPU_LIMIT",
        "ALIGNFLOW_MEMORY_REQUEST", "ALIGNFLOW_MEMORY_LIMIT", "ALIGNFLOW_SHM_SIZE", "ALIGNFLOW_ACTIVE_DEADLINE_SECONDS",
        "ALIGNFLOW_PENDING_TIMEOUT_SECONDS", "ALIGNFLOW_POLL_SECONDS", "ALIGNFLOW_S3_RETRY_SECONDS",
        "ALIGNFLOW_JOB_KIND", "ALIGNFLOW_TRAINER_RUNTIME", "ALIGNFLOW_INITIALIZERS"}


def config(values: dict) -> dict[str, str]:
    return one(render(values), "ConfigMap")["data"]


def test_defaults():
    assert config({}) == {
        "ALIGNFLOW_DEFAULTS_CONFIGMAP": "af-alignflow-defaults",
        "ALIGNFLOW_LAUNCHER_IMAGE": "ghcr.io/alignflow/launcher:latest",
        "ALIGNFLOW_TRAINER_IMAGE": "ghcr.io/alignflow/trainer:latest",
        "ALIGNFLOW_TRAINER_VLLM_IMAGE": "ghcr.io/alignflow/trainer:latest-vllm",
        "ALIGNFLOW_JOB_KIND": "auto",
        "ALIGNFLOW_TRAINER_RUNTIME": "af-alignflow-torch",
        "ALIGNFLOW_INITIALIZERS": "false",
        "ALIGNFLOW_SERVICE_ACCOUNT": "af-alignflow",
        "ALIGNFLOW_PIPELINE_ROOT": "s3://alignflow/pipelines",
        "ALIGNFLOW_S3_BUCKET": "alignflow",
        "ALIGNFLOW_S3_SECRET": "",
        "AWS_ENDPOINT_URL": "",
        "AWS_DEFAULT_REGION": "us-east-1",
        "MLFLOW_TRACKING_URI": "",
        "ALIGNFLOW_MLFLOW_SECRET": "",
        "ALIGNFLOW_MLFLOW_EXTERNAL_URL": "",
        "ALIGNFLOW_MLFLOW_TOKEN_AUDIENCE": "",
        "KFP_HOST": "http://ml-pipeline.kubeflow:8888",
        "KFP_NAMESPACE": "",
        "ALIGNFLOW_NODE_SELECTOR": "{}",
        "ALIGNFLOW_TOLERATIONS": "[]",
        "ALIGNFLOW_GPU_RESOURCE": "nvidia.com/gpu",
        "ALIGNFLOW_PRIORITY_CLASS": "",
        "ALIGNFLOW_KUEUE_QUEUE": "",
        "ALIGNFLOW_ALLOWED_IMAGES": "ghcr.io/alignflow/trainer",
        "ALIGNFLOW_ALLOWED_SECRETS": "",
        "ALIGNFLOW_REWARD_FUNCTIONS": "",
        "ALIGNFLOW_ALLOWED_REWARD_MODULES": "",
        "ALIGNFLOW_ENVIRONMENTS": "",
        "ALIGNFLOW_ALLOWED_ENVIRONMENT_MODULES": "",
        "ALIGNFLOW_TOOLS": "",
        "ALIGNFLOW_ALLOWED_TOOL_MODULES": "",
        "ALIGNFLOW_AFFINITY": "{}",
        "ALIGNFLOW_CPU_REQUEST": "",
        "ALIGNFLOW_CPU_LIMIT": "",
        "ALIGNFLOW_MEMORY_REQUEST": "",
        "ALIGNFLOW_MEMORY_LIMIT": "",
        "ALIGNFLOW_SHM_SIZE": "2Gi",
        "ALIGNFLOW_ACTIVE_DEADLINE_SECONDS": "0",
        "ALIGNFLOW_PENDING_TIMEOUT_SECONDS": "900",
        "ALIGNFLOW_POLL_SECONDS": "10",
        "ALIGNFLOW_S3_RETRY_SECONDS": "300",
    }


def test_configured_platform():
    data = config({
        "images": {"launcher": {"repository": "registry.corp/ml/launcher", "tag": "1.2"},
                   "trainer": {"repository": "registry.corp/ml/trainer", "tag": "1.2"}},
        "serviceAccount": {"name": "alignflow-runner"},
        "s3": {"endpoint": "http://minio.storage:9000", "region": "eu-west-1", "credentialsSecret": "s3-keys"},
        "mlflow": {"enabled": True, "externalUrl": "https://mlflow.corp.example", "credentialsSecret": "mlflow-auth",
                   "tokenAudience": "mlflow.corp.example"},
        "gpu": {"nodeSelector": {"nvidia.com/gpu.present": "true"}, "resourceName": "nvidia.com/mig-1g.10gb",
                "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]},
        "scheduling": {"priorityClassName": "training", "kueueQueue": "gpu-queue"},
        "training": {"jobKind": "trainjob", "runtime": {"create": False, "name": "team-torch"}},
        "policy": {"allowedTrainerImages": ["registry.corp/ml/", "registry.corp/ml/trainer"],
                   "allowedSecrets": ["hf-token", "s3-keys"],
                   "rewardFunctions": {"exact": "rewards.text:exact_match", "length": "rewards.text:length_penalty"},
                   "allowedRewardModulePrefixes": ["corp_rewards.", "rewards."],
                   "environments": {"quiz": "acme_agents.quiz:Quiz"}, "tools": {"search": "acme_tools.web:search"},
                   "allowedToolModulePrefixes": ["acme_tools"]},
    })
    assert set(data) == KEYS
    assert data["ALIGNFLOW_LAUNCHER_IMAGE"] == "registry.corp/ml/launcher:1.2"
    assert data["ALIGNFLOW_TRAINER_IMAGE"] == "registry.corp/ml/trainer:1.2"
    assert data["ALIGNFLOW_TRAINER_VLLM_IMAGE"] == "registry.corp/ml/trainer:latest-vllm"
    assert data["ALIGNFLOW_SERVICE_ACCOUNT"] == "alignflow-runner"
    assert (data["ALIGNFLOW_JOB_KIND"], data["ALIGNFLOW_TRAINER_RUNTIME"]) == ("trainjob", "team-torch")
    assert (data["AWS_ENDPOINT_URL"], data["AWS_DEFAULT_REGION"]) == ("http://minio.storage:9000", "eu-west-1")
    assert data["ALIGNFLOW_S3_SECRET"] == "s3-keys"
    assert data["MLFLOW_TRACKING_URI"] == "http://af-alignflow-mlflow.ml.svc:5000"
    assert data["ALIGNFLOW_MLFLOW_EXTERNAL_URL"] == "https://mlflow.corp.example"
    assert data["ALIGNFLOW_MLFLOW_SECRET"] == "mlflow-auth"
    assert data["ALIGNFLOW_MLFLOW_TOKEN_AUDIENCE"] == "mlflow.corp.example"
    assert json.loads(data["ALIGNFLOW_NODE_SELECTOR"]) == {"nvidia.com/gpu.present": "true"}
    assert json.loads(data["ALIGNFLOW_TOLERATIONS"]) == [{"key": "nvidia.com/gpu", "operator": "Exists",
                                                          "effect": "NoSchedule"}]
    assert data["ALIGNFLOW_GPU_RESOURCE"] == "nvidia.com/mig-1g.10gb"
    assert (data["ALIGNFLOW_PRIORITY_CLASS"], data["ALIGNFLOW_KUEUE_QUEUE"]) == ("training", "gpu-queue")
    # the chart's own trainer repository and S3 Secret are always allowed (the chart's retrain uses them), once
    assert data["ALIGNFLOW_ALLOWED_IMAGES"] == "registry.corp/ml/trainer,registry.corp/ml/"
    assert data["ALIGNFLOW_ALLOWED_SECRETS"] == "s3-keys,hf-token"
    assert data["ALIGNFLOW_REWARD_FUNCTIONS"] == "exact=rewards.text:exact_match,length=rewards.text:length_penalty"
    assert (data["ALIGNFLOW_ENVIRONMENTS"], data["ALIGNFLOW_TOOLS"]) == ("quiz=acme_agents.quiz:Quiz",
                                                                         "search=acme_tools.web:search")
    assert (data["ALIGNFLOW_ALLOWED_TOOL_MODULES"], data["ALIGNFLOW_ALLOWED_ENVIRONMENT_MODULES"]) == ("acme_tools", "")
    assert data["ALIGNFLOW_ALLOWED_REWARD_MODULES"] == "corp_rewards.,rewards."


AFFINITY = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
    {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-H100-80GB-HBM3"]}]}]}}}


def test_scheduling_values_become_the_keys_the_launcher_reads():
    """Rendered as the component pod's env, they reach the PyTorchJob (tests/components/launcher/settings/test_scheduling.py)."""
    from components.launcher.kinds.pytorchjob.manifest import build_pytorchjob
    from components.launcher.stage_job import stage_spec
    from components.stage_io import cluster_options

    data = config({"s3": {"retrySeconds": 60},
                   "scheduling": {"affinity": AFFINITY, "shmSize": "16Gi", "activeDeadlineSeconds": 172800,
                                  "pendingTimeoutSeconds": 600, "pollSeconds": 2.5,
                                  "resources": {"requests": {"cpu": 8, "memory": "64Gi"},
                                                "limits": {"cpu": "16", "memory": "96Gi"}}}})
    assert json.loads(data["ALIGNFLOW_AFFINITY"]) == AFFINITY
    assert [data[f"ALIGNFLOW_{name}"] for name in ("CPU_REQUEST", "CPU_LIMIT", "MEMORY_REQUEST", "MEMORY_LIMIT",
                                                   "SHM_SIZE", "ACTIVE_DEADLINE_SECONDS", "PENDING_TIMEOUT_SECONDS",
                                                   "S3_RETRY_SECONDS")] == [
        "8", "16", "64Gi", "96Gi", "16Gi", "172800", "600", "60"]
    cluster = cluster_options({"launcher_mode": "kubernetes", "trainer_image": "", "num_nodes": 1,
                               "gpus_per_node": 1, "s3_secret": ""}, data)
    job = build_pytorchjob(stage_spec("sft", "s3://b/sft.yaml", "run-1", "sft", cluster))
    pod = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
    assert pod["affinity"] == AFFINITY and pod["containers"][0]["resources"]["limits"]["memory"] == "96Gi"
    assert job["spec"]["runPolicy"]["activeDeadlineSeconds"] == 172800 and cluster.pending_timeout_seconds == 600
    assert data["ALIGNFLOW_POLL_SECONDS"] == "2.5" and cluster.poll_seconds == 2.5


def test_the_charts_default_scheduling_keys_leave_the_launchers_defaults():
    from components.stage_io import cluster_options

    cluster = cluster_options({"launcher_mode": "kubernetes", "trainer_image": "", "num_nodes": 1,
                               "gpus_per_node": 1, "s3_secret": ""}, config({}))
    assert (cluster.affinity, cluster.cpu_request, cluster.memory_limit, cluster.active_deadline_seconds) == (
        {}, None, None, None)
    assert cluster.env["ALIGNFLOW_S3_RETRY_SECONDS"] == "300"


@pytest.mark.parametrize("scheduling", [
    {"shmSize": "2GB"}, {"resources": {"requests": {"cpu": "eight"}}}, {"activeDeadlineSeconds": -1},
    {"affinity": {"nodeAfinity": {}}}, {"pendingTimeoutSeconds": 0}, {"pollSeconds": 0},
])
def test_bad_scheduling_values_are_rejected_at_install(scheduling):
    import helm_python

    with pytest.raises(helm_python.HelmValuesError):
        render({"scheduling": scheduling})


def test_keys_are_environment_variable_names_the_jobs_load():
    documents = render({"retrain": {"enabled": True, "mode": "cronJob"}})
    config_map = one(documents, "ConfigMap")
    assert all(re.fullmatch(r"[A-Z_][A-Z0-9_]*", key) for key in config_map["data"])
    for where, spec in pods(documents):
        for container in containers(spec):
            assert {"configMapRef": {"name": config_map["metadata"]["name"]}} in container["envFrom"], where


def test_every_key_the_pipelines_map_into_component_pods_exists():
    """pipelines/options.py maps DEFAULTS_KEYS into each component pod with configMapKeyRefs, which are not
    optional: a key missing here would stop every component pod from starting."""
    from pipelines.options import DEFAULTS_KEYS as keys

    data = config({})
    assert set(keys) <= set(data), set(keys) - set(data)
    assert data["ALIGNFLOW_DEFAULTS_CONFIGMAP"] == one(render({}), "ConfigMap")["metadata"]["name"]


def test_components_read_the_image_keys():
    """components/images.py picks the images from the same names, so loading the map as env configures them."""
    source = (Path(__file__).parents[2] / "components" / "images.py").read_text()
    assert set(re.findall(r'os\.environ\.get\("(ALIGNFLOW_\w+)"', source)) <= KEYS
    assert "ALIGNFLOW_LAUNCHER_IMAGE" in source and "ALIGNFLOW_TRAINER_IMAGE" in source


@pytest.mark.parametrize("policy", [
    {"allowedTrainerImages": ["a,b"]},
    {"allowedSecrets": ["Not_A_Secret_Name"]},
    {"rewardFunctions": {"exact": "no-colon"}},
    {"rewardFunctions": {"a,b": "rewards.text:exact"}},
    {"allowedRewardModulePrefixes": ["bad prefix"]},
])
def test_policy_entries_that_would_break_the_comma_lists_are_rejected(policy):
    import helm_python

    with pytest.raises(helm_python.HelmValuesError):
        render({"policy": policy})
