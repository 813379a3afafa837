"""The platform's defaults and policy: environment -> ClusterOptions, allow-lists, credentials kept out of manifests."""

from __future__ import annotations

import json
import re

import pytest

from components.launcher.kinds.pytorchjob.manifest import build_pytorchjob
from components.launcher.pod.spec import STAGES
from components.launcher.settings.platform import PlatformDefaults, check_allowed, is_image_allowed, strip_credentials
from components.launcher.stage_job import ClusterOptions, run_stage_job, stage_spec
from components.stage_io import cluster_options
from tests.components.launcher.crd import pytorchjob_validator
from trainer.errors import LaunchError

# What the chart's defaults ConfigMap puts into the component pod's environment.
PLATFORM = {
    "ALIGNFLOW_TRAINER_IMAGE": "registry.corp/ml/alignflow-trainer:2.1",
    "AWS_ENDPOINT_URL": "http://minio.kubeflow:9000",
    "AWS_DEFAULT_REGION": "eu-west-1",
    "ALIGNFLOW_S3_SECRET": "alignflow-s3",
    "MLFLOW_TRACKING_URI": "http://mlflow.alignflow:5000",
    "ALIGNFLOW_NODE_SELECTOR": json.dumps({"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}),
    "ALIGNFLOW_TOLERATIONS": json.dumps([{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]),
    "ALIGNFLOW_GPU_RESOURCE": "nvidia.com/mig-3g.40gb",
    "ALIGNFLOW_PRIORITY_CLASS": "training",
    "ALIGNFLOW_KUEUE_QUEUE": "team-ml",
    "ALIGNFLOW_SERVICE_ACCOUNT": "alignflow-trainer",
}


def params(**changes) -> dict:
    """A training component's cluster parameters as `locals()` hands them over (new defaults: empty)."""
    return {"launcher_mode": "kubernetes", "trainer_image": "", "num_nodes": 1, "gpus_per_node": 2,
            "s3_secret": "", **changes}


def test_platform_defaults_come_from_the_pod_environment():
    cluster = cluster_options(params(), PLATFORM)
    assert cluster.image == "registry.corp/ml/alignflow-trainer:2.1"
    assert cluster.s3_secret == "alignflow-s3"
    assert cluster.node_selector == {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}
    assert cluster.tolerations[0]["key"] == "nvidia.com/gpu"
    assert (cluster.gpu_resource, cluster.priority_class, cluster.kueue_queue, cluster.service_account) == (
        "nvidia.com/mig-3g.40gb", "training", "team-ml", "alignflow-trainer")
    assert cluster.env == {"MLFLOW_TRACKING_URI": "http://mlflow.alignflow:5000",
                           "AWS_ENDPOINT_URL": "http://minio.kubeflow:9000", "AWS_DEFAULT_REGION": "eu-west-1"}
    job = build_pytorchjob(stage_spec("sft", "s3://b/sft.yaml", "run-1", "sft", cluster))
    pytorchjob_validator().validate(job)
    pod = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
    assert pod["priorityClassName"] == "training" and pod["serviceAccountName"] == "alignflow-trainer"
    assert pod["containers"][0]["resources"]["limits"] == {"nvidia.com/mig-3g.40gb": 2}
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-ml"


def test_explicit_component_parameters_win_over_the_platform():
    cluster = cluster_options(params(trainer_image="registry.corp/ml/alignflow-trainer:2.2-rc1", s3_secret="team-s3",
                                     node_selector={"pool": "a100"}, kueue_queue="urgent",
                                     pending_timeout_seconds=60), PLATFORM)
    assert (cluster.image, cluster.s3_secret) == ("registry.corp/ml/alignflow-trainer:2.2-rc1", "team-s3")
    assert cluster.node_selector == {"pool": "a100"} and cluster.kueue_queue == "urgent"
    assert cluster.pending_timeout_seconds == 60


def test_the_published_default_image_yields_to_the_platforms_image():
    # Components compiled before the default became empty still pass the published image.
    cluster = cluster_options(params(trainer_image="ghcr.io/alignflow/trainer:latest"), PLATFORM)
    assert cluster.image == "registry.corp/ml/alignflow-trainer:2.1"
    assert cluster_options(params(), {}).image == "ghcr.io/alignflow/trainer:latest"  # no platform: the default


def test_a_stage_sampling_with_vllm_runs_the_trainer_images_vllm_variant():
    platform = {**PLATFORM, "ALIGNFLOW_TRAINER_VLLM_IMAGE": "registry.corp/ml/alignflow-trainer:2.1-vllm"}
    vllm, hf = {"rollout": {"engine": "vllm"}}, {"rollout": {"engine": "hf"}}  # the stage's resolved config
    for given in ({}, {"trainer_image": "ghcr.io/alignflow/trainer:latest"}):
        assert cluster_options(params(**given), platform, config=vllm).image == "registry.corp/ml/alignflow-trainer:2.1-vllm"
    assert cluster_options(params(), {}, config=vllm).image == "ghcr.io/alignflow/trainer:latest-vllm"
    assert cluster_options(params(), platform, config=hf).image == "registry.corp/ml/alignflow-trainer:2.1"
    chosen = cluster_options(params(trainer_image="registry.corp/ml/own:1"), platform, config=vllm)
    assert chosen.image == "registry.corp/ml/own:1"  # a run's own image wins (the allow-list still applies)


@pytest.mark.parametrize(("name", "value", "expected"), [
    ("ALIGNFLOW_NODE_SELECTOR", "{gpu: true}", "ALIGNFLOW_NODE_SELECTOR (ConfigMap key) is not valid JSON"),
    ("ALIGNFLOW_NODE_SELECTOR", '["a"]', "ALIGNFLOW_NODE_SELECTOR (ConfigMap key) is ['a'], expected a JSON object"),
    ("ALIGNFLOW_TOLERATIONS", '{"key": "x"}', "ALIGNFLOW_TOLERATIONS (ConfigMap key) is {'key': 'x'}, expected a JSON list of objects"),
    ("ALIGNFLOW_TOLERATIONS", "[{'key': 'x'}]", "ALIGNFLOW_TOLERATIONS (ConfigMap key) is not valid JSON"),
])
def test_bad_json_in_the_environment_is_one_clear_error_naming_the_variable(name, value, expected):
    with pytest.raises(LaunchError, match=re.escape(expected)):
        cluster_options(params(), {**PLATFORM, name: value})


def test_empty_or_null_json_variables_mean_none():
    cluster = cluster_options(params(), {"ALIGNFLOW_NODE_SELECTOR": "null", "ALIGNFLOW_TOLERATIONS": ""})
    assert cluster.node_selector == {} and cluster.tolerations == []


@pytest.mark.parametrize(("image", "allowed"), [
    ("ghcr.io/acme/trainer:1.2", True),
    ("ghcr.io/acme/trainer@sha256:" + "a" * 64, True),
    ("registry.corp/ml/anything:3", True),  # under a prefix ending in "/"
    ("registry.corp/mlops/trainer:1", False),  # "registry.corp/ml/" is not a string prefix match
    ("ghcr.io/acme/trainer-evil:1", False),
    ("ghcr.io/acme/trainer", True),
    ("docker.io/library/python:3.11", False),
])
def test_image_allow_list_matches_names_and_prefixes_at_boundaries(image, allowed):
    assert is_image_allowed(image, ["ghcr.io/acme/trainer", "registry.corp/ml/"]) is allowed


def test_allow_lists_default_to_the_platforms_own_image_and_secret():
    only_own = PlatformDefaults.from_environment(PLATFORM)
    assert only_own.allowed_images == ["registry.corp/ml/alignflow-trainer:2.1"]
    assert only_own.allowed_secrets == ["alignflow-s3"]
    anything = PlatformDefaults.from_environment({"ALIGNFLOW_ALLOWED_IMAGES": "", "ALIGNFLOW_ALLOWED_SECRETS": " "})
    assert anything.allowed_images is None and anything.allowed_secrets is None
    listed = PlatformDefaults.from_environment({**PLATFORM, "ALIGNFLOW_ALLOWED_IMAGES": "a/b, c/",
                                                "ALIGNFLOW_ALLOWED_SECRETS": "s1,s2"})
    assert listed.allowed_images == ["a/b", "c/"] and listed.allowed_secrets == ["s1", "s2"]


def test_a_refusal_names_the_value_and_the_allowed_ones():
    with pytest.raises(LaunchError) as err:
        check_allowed("evil.io/miner:1", "", ["ghcr.io/acme/trainer", "registry.corp/ml/"], None)
    assert str(err.value) == ("trainer image 'evil.io/miner:1' is not allowed on this platform; allowed images "
                              "(ALIGNFLOW_ALLOWED_IMAGES, else ALIGNFLOW_TRAINER_IMAGE): ghcr.io/acme/trainer, "
                              "registry.corp/ml/")
    with pytest.raises(LaunchError, match="S3 Secret 'admin-credentials' is not allowed .*: alignflow-s3"):
        check_allowed("ghcr.io/acme/trainer:1", "admin-credentials", None, ["alignflow-s3"])
    check_allowed("ghcr.io/acme/trainer:1", "", None, ["alignflow-s3"])  # no Secret at all is fine


@pytest.mark.parametrize("mode", ["local", "kubernetes"])
@pytest.mark.parametrize("changes", [{"trainer_image": "evil.io/miner:1"}, {"s3_secret": "admin-credentials"}])
def test_refused_before_any_job_is_created_or_anything_written_in_both_modes(tmp_path, mode, changes):
    cluster = cluster_options(params(launcher_mode=mode, **changes), PLATFORM)
    with pytest.raises(LaunchError, match="is not allowed on this platform"):
        # In kubernetes mode no API client exists here: the refusal comes before one is needed.
        run_stage_job("sft", {}, model_uri=str(tmp_path / "model"), job_root=str(tmp_path / "job"), run_id="r",
                      task="sft", cluster=cluster)
    assert list(tmp_path.iterdir()) == []


PASSWORD = "pl4nted-s3cr3t"


@pytest.mark.parametrize("num_nodes", [1, 3])
def test_no_rendered_manifest_contains_the_tracking_password(num_nodes):
    environ = {**PLATFORM, "MLFLOW_TRACKING_URI": f"https://alice:{PASSWORD}@mlflow.corp:8443/tracking",
               "ALIGNFLOW_MLFLOW_SECRET": "mlflow-credentials"}
    cluster = cluster_options(params(num_nodes=num_nodes), environ)
    for stage in STAGES:
        job = build_pytorchjob(stage_spec(stage, f"s3://b/{stage}.yaml", "run-1", stage, cluster))
        text = json.dumps(job)
        assert PASSWORD not in text and "alice" not in text
        (replica,) = job["spec"]["pytorchReplicaSpecs"].values()
        env = {item["name"]: item for item in replica["template"]["spec"]["containers"][0]["env"]}
        assert env["MLFLOW_TRACKING_URI"]["value"] == "https://mlflow.corp:8443/tracking"
        for key in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN"):
            assert env[key]["valueFrom"]["secretKeyRef"] == {"name": "mlflow-credentials", "key": key,
                                                            "optional": True}


def test_a_tracking_password_without_a_secret_to_carry_it_is_refused_without_echoing_it():
    with pytest.raises(LaunchError, match="carries credentials, and ALIGNFLOW_MLFLOW_SECRET names no Secret") as err:
        cluster_options(params(), {**PLATFORM, "MLFLOW_TRACKING_URI": f"https://alice:{PASSWORD}@mlflow.corp"})
    assert PASSWORD not in str(err.value)


def test_a_hand_built_cluster_option_cannot_smuggle_a_password_either():
    cluster = ClusterOptions(mode="kubernetes", namespace="ml", env={"MLFLOW_TRACKING_URI": f"http://a:{PASSWORD}@m"})
    with pytest.raises(LaunchError, match="is a URL with a password") as err:
        build_pytorchjob(stage_spec("sft", "s3://b/sft.yaml", "run-1", "sft", cluster))
    assert PASSWORD not in str(err.value)


def test_credentials_are_stripped_from_any_url_form():
    assert strip_credentials("https://u:p@h:1/x?y=1") == ("https://h:1/x?y=1", True)
    assert strip_credentials("https://token@h") == ("https://h", True)
    assert strip_credentials("sqlite:////tmp/mlflow.db") == ("sqlite:////tmp/mlflow.db", False)
    assert strip_credentials("databricks") == ("databricks", False)


def test_policy_cannot_be_overridden_by_component_parameters():
    cluster = cluster_options(params(allowed_images=["evil.io/"], allowed_secrets=["admin"], mlflow_secret="other",
                                     namespace="kube-system"), {**PLATFORM, "ALIGNFLOW_MLFLOW_SECRET": "mlflow"})
    assert cluster.allowed_images == ["registry.corp/ml/alignflow-trainer:2.1"]
    assert cluster.allowed_secrets == ["alignflow-s3"] and cluster.mlflow_secret == "mlflow"
    assert cluster.namespace != "kube-system"


def test_the_charts_allow_lists_reach_the_training_pods_where_the_trainer_resolves_them():
    """Chart values -> the defaults ConfigMap -> the component pod's env -> both job kinds' containers -> the trainer
    in that container resolves the platform's reward function, environment and tool (and still refuses `os:system`)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from components.launcher.kinds.trainjob.request import build_trainjob_request
    from tests.helm.chart import one, render

    policy = {"rewardFunctions": {"length": "tests.trainer.online.rewards:length"},
              "environments": {"echo": "tests.trainer.agents.environments:EchoEnvironment"},
              "allowedToolModulePrefixes": ["tests.trainer.agents"]}
    configmap = one(render({"policy": policy}), "ConfigMap")["data"]
    cluster = cluster_options({"launcher_mode": "kubernetes", "trainer_image": "", "num_nodes": 1, "gpus_per_node": 1,
                               "s3_secret": ""}, configmap)
    spec = stage_spec("grpo", "s3://b/grpo.yaml", "run-1", "grpo", cluster)
    container = build_pytorchjob(spec)["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    pytorchjob_env = {item["name"]: item["value"] for item in container["env"] if "value" in item}
    trainjob_env = build_trainjob_request(spec).trainer.env
    check = ("from trainer.allow_list import ENVIRONMENTS, REWARDS, TOOLS, resolve\n"
             "print(resolve(REWARDS, 'length').__name__, resolve(ENVIRONMENTS, 'echo').__name__,"
             " resolve(TOOLS, 'tests.trainer.agents.environments:hang').__name__)\n"
             "try:\n    resolve(TOOLS, 'os:system')\nexcept Exception as err:\n    print(err)\n")
    root = Path(__file__).parents[4]
    for env in (pytorchjob_env, trainjob_env):
        pod = {**env, "PATH": os.environ["PATH"], "PYTHONPATH": str(root)}  # the image installs alignflow
        printed = subprocess.run([sys.executable, "-c", check], env=pod, cwd=root, capture_output=True, text=True,
                                 check=True).stdout.splitlines()
        assert printed[0] == "length EchoEnvironment hang"
        assert printed[1].startswith("environment.tools is 'os:system', which is not an allowed tool; allowed: "
                                     "calculator, python; modules under tests.trainer.agents")
