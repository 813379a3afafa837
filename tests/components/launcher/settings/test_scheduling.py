"""Scheduling options from the chart's ConfigMap (the pod's env) and a run's `scheduling` parameter, into the
PyTorchJob manifest; bad values name the ConfigMap key or the parameter's key."""

from __future__ import annotations

import json

import pytest

from components.launcher.kinds.pytorchjob.manifest import build_pytorchjob
from components.launcher.stage_job import stage_spec
from components.stage_io import cluster_options
from tests.components.launcher.crd import pytorchjob_validator
from trainer.errors import LaunchError

AFFINITY = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
    {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-H100-80GB-HBM3"]}]}]}}}
# What the chart's defaults ConfigMap renders for a platform that sets every scheduling value.
PLATFORM = {
    "ALIGNFLOW_AFFINITY": json.dumps(AFFINITY),
    "ALIGNFLOW_CPU_REQUEST": "8", "ALIGNFLOW_CPU_LIMIT": "16",
    "ALIGNFLOW_MEMORY_REQUEST": "64Gi", "ALIGNFLOW_MEMORY_LIMIT": "96Gi",
    "ALIGNFLOW_SHM_SIZE": "16Gi",
    "ALIGNFLOW_ACTIVE_DEADLINE_SECONDS": "172800",
    "ALIGNFLOW_PENDING_TIMEOUT_SECONDS": "600",
    "ALIGNFLOW_S3_RETRY_SECONDS": "120",
}


def params(**changes) -> dict:
    return {"launcher_mode": "kubernetes", "trainer_image": "", "num_nodes": 1, "gpus_per_node": 1,
            "s3_secret": "", **changes}


def pod_of(job: dict) -> dict:
    return job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]


def test_configmap_scheduling_values_reach_the_pytorchjob_manifest():
    cluster = cluster_options(params(), PLATFORM)
    assert cluster.pending_timeout_seconds == 600
    job = build_pytorchjob(stage_spec("sft", "s3://b/sft.yaml", "run-1", "sft", cluster))
    pytorchjob_validator().validate(job)
    pod = pod_of(job)
    assert pod["affinity"] == AFFINITY
    assert pod["containers"][0]["resources"] == {"requests": {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": 1},
                                                 "limits": {"cpu": "16", "memory": "96Gi", "nvidia.com/gpu": 1}}
    assert pod["volumes"] == [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}}]
    assert job["spec"]["runPolicy"]["activeDeadlineSeconds"] == 172800
    env = {item["name"]: item.get("value") for item in pod["containers"][0]["env"]}
    assert env["ALIGNFLOW_S3_RETRY_SECONDS"] == "120"  # the trainer's S3 calls ride out outages as long


def test_the_runs_scheduling_parameter_wins_over_the_configmap():
    overrides = {"cpu_request": "4", "memory_limit": "128Gi", "active_deadline_seconds": 3600,
                 "pending_timeout_seconds": 30, "tolerations": [{"key": "spot", "operator": "Exists"}]}
    cluster = cluster_options(params(scheduling=overrides), PLATFORM)
    job = build_pytorchjob(stage_spec("sft", "s3://b/sft.yaml", "run-1", "sft", cluster))
    pytorchjob_validator().validate(job)
    resources = pod_of(job)["containers"][0]["resources"]
    assert (resources["requests"]["cpu"], resources["limits"]["memory"]) == ("4", "128Gi")
    assert resources["requests"]["memory"] == "64Gi"  # what the run leaves alone stays the platform's
    assert job["spec"]["runPolicy"]["activeDeadlineSeconds"] == 3600
    assert cluster.pending_timeout_seconds == 30
    assert pod_of(job)["tolerations"] == [{"key": "spot", "operator": "Exists"}]
    # The parameter may also arrive as JSON text (a `--param scheduling=...` from a file or CI).
    assert cluster_options(params(scheduling=json.dumps(overrides)), PLATFORM).cpu_request == "4"


def test_unset_or_empty_configmap_values_keep_the_launchers_defaults():
    empty = {name: "" for name in PLATFORM} | {"ALIGNFLOW_AFFINITY": "{}", "ALIGNFLOW_ACTIVE_DEADLINE_SECONDS": "0"}
    cluster = cluster_options(params(), empty)
    assert (cluster.affinity, cluster.cpu_request, cluster.shm_size, cluster.active_deadline_seconds) == (
        {}, None, "2Gi", None)
    assert cluster.pending_timeout_seconds == 900.0
    assert "ALIGNFLOW_S3_RETRY_SECONDS" not in cluster.env


@pytest.mark.parametrize(("variable", "value", "expected"), [
    ("ALIGNFLOW_AFFINITY", "{nodeAffinity: 1}", "ALIGNFLOW_AFFINITY (ConfigMap key) is not valid JSON"),
    ("ALIGNFLOW_AFFINITY", "[1]", "ALIGNFLOW_AFFINITY (ConfigMap key) is [1], expected a JSON object"),
    ("ALIGNFLOW_MEMORY_LIMIT", "64GB", "ALIGNFLOW_MEMORY_LIMIT (ConfigMap key) is '64GB', expected a Kubernetes "
                                      "quantity"),
    ("ALIGNFLOW_PENDING_TIMEOUT_SECONDS", "ten", "ALIGNFLOW_PENDING_TIMEOUT_SECONDS (ConfigMap key) is 'ten'"),
    ("ALIGNFLOW_ACTIVE_DEADLINE_SECONDS", "-5", "ALIGNFLOW_ACTIVE_DEADLINE_SECONDS (ConfigMap key) is '-5'"),
    ("ALIGNFLOW_S3_RETRY_SECONDS", "5m", "ALIGNFLOW_S3_RETRY_SECONDS (ConfigMap key) is '5m'"),
])
def test_a_bad_configmap_value_is_one_error_naming_its_key(variable, value, expected):
    with pytest.raises(LaunchError) as raised:
        cluster_options(params(), {**PLATFORM, variable: value})
    assert expected in str(raised.value) and "\n" not in str(raised.value)


@pytest.mark.parametrize(("overrides", "expected"), [
    ({"cpu_request": "eight"}, "scheduling.cpu_request is 'eight', expected a Kubernetes quantity"),
    ({"affinity": "not json"}, "scheduling.affinity is not valid JSON"),
    ({"active_deadline_seconds": 0}, "scheduling.active_deadline_seconds is 0, expected a positive number"),
    ({"cpu": "8"}, "scheduling has unknown key(s) cpu; expected any of"),
    ({"service_account": "cluster-admin"}, "scheduling has unknown key(s) service_account"),
    ({"kueue_queue": "other-team", "priority_class": "system-node-critical"},
     "scheduling has unknown key(s) kueue_queue, priority_class"),
    ("[1, 2]", "scheduling is [1, 2], expected a JSON object"),
])
def test_a_bad_scheduling_parameter_is_one_error_naming_its_key(overrides, expected):
    with pytest.raises(LaunchError) as raised:
        cluster_options(params(scheduling=overrides), PLATFORM)
    assert expected in str(raised.value)
