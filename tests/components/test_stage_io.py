"""From component inputs to stage configs and jobs: what every pipeline stage would create."""

from __future__ import annotations

import pytest

from components.launcher.kinds.pytorchjob.manifest import build_pytorchjob
from components.launcher.pod.spec import STAGES
from components.launcher.stage_job import ClusterOptions, stage_spec
from components.stage_io import cluster_options, default_job_root, stage_config
from tests.components.launcher.crd import pytorchjob_validator


@pytest.mark.parametrize("stage", STAGES)
def test_every_stage_job_validates_against_the_crd(stage):
    cluster = ClusterOptions(mode="kubernetes", image="registry/alignflow-trainer:1", namespace="team-ml",
                             num_nodes=2, nproc_per_node=8, gpus_per_node=8, s3_secret="s3-credentials",
                             node_selector={"nvidia.com/gpu.present": "true"},
                             tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                             env={"MLFLOW_TRACKING_URI": "http://mlflow.team-ml:5000"})
    job = build_pytorchjob(stage_spec(stage, f"s3://runs/abc/alignflow-jobs/{stage}/{stage}.yaml", "abc-123", stage, cluster))
    pytorchjob_validator().validate(job)
    assert job["metadata"]["labels"]["alignflow/run"] == "abc-123"  # what the exit handler deletes by
    container = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    assert container["command"][:6] == ["python", "-m", "trainer.launch", "-m", "trainer", stage]
    assert job["spec"]["elasticPolicy"]["minReplicas"] == job["spec"]["elasticPolicy"]["maxReplicas"] == 2


def test_job_root_survives_a_retry_on_a_cluster():
    first = "s3://root/rlhf-dpo/run-7/train-dpo/1234/model"
    retry = "s3://root/rlhf-dpo/run-7/train-dpo/5678/model"  # a retried task: a new execution id
    root = default_job_root(first, "run-7", "dpo")
    assert root == default_job_root(retry, "run-7", "dpo") == "s3://root/rlhf-dpo/run-7/alignflow-jobs/dpo"
    assert default_job_root("/tmp/root/rlhf-dpo-x/train-dpo/model", "42", "dpo") == "/tmp/root/rlhf-dpo-x/train-dpo/job"


class FakeArtifact:
    """Just the `uri` an input artifact carries (KFP's own class needs a running executor)."""

    def __init__(self, uri: str) -> None:
        self.uri = uri


def test_stage_config_maps_component_parameters_and_settings():
    params = {"base_model": FakeArtifact("s3://m/sft"), "train_dataset": FakeArtifact("s3://d/prompts"),
              "eval_dataset": FakeArtifact("s3://d/eval"), "reward_model": FakeArtifact("s3://m/rm"),
              "reward_function": "", "lr": 1e-6, "micro_batch_size": 8, "max_length": 512, "num_episodes": 7,
              "kl_coef": 0.1, "rollout_engine": "vllm", "settings": {"ppo.cliprange": 0.1, "optimizer.lr": 2e-6}}
    config = stage_config("ppo", params)
    assert config["model"]["path"] == "s3://m/sft"
    assert config["rollout"] == {"engine": "vllm"}
    assert config["reward"] == {"model_path": "s3://m/rm"}
    assert config["ppo"] == {"num_episodes": 7, "kl_coef": 0.1, "critic_model_path": "s3://m/rm", "cliprange": 0.1}
    assert config["optimizer"]["lr"] == 2e-6  # settings win over the named parameter


def grpo_params(**changes) -> dict:
    """A GRPO component's inputs, as `locals()` hands them over."""
    return {"base_model": FakeArtifact("s3://m/sft"), "train_dataset": FakeArtifact("s3://d/prompts"),
            "eval_dataset": FakeArtifact("s3://d/eval"), "reward_model": None, "reward_function": "length",
            "lr": 1e-6, "micro_batch_size": 8, "max_length": 512, "num_episodes": 2, "num_generations": 4,
            "rollout_engine": "hf", "launcher_mode": "kubernetes", "trainer_image": "", "num_nodes": 1,
            "gpus_per_node": 1, **changes}


@pytest.mark.parametrize(("changes", "engine"), [
    # A nested section in `settings` replaces the parameter's engine: the image must follow the config.
    ({"settings": {"rollout": {"engine": "vllm"}}}, "vllm"),
    ({"rollout_engine": "vllm", "settings": {"rollout": {"engine": "hf"}}}, "hf"),
    ({"settings": {"rollout.engine": "vllm"}}, "vllm"),
    ({"rollout_engine": "vllm"}, "vllm"),
    ({"rollout_engine": "auto"}, "auto"),  # chosen in the pod, among the engines of the vLLM variant
    ({}, "hf"),
])
def test_the_image_follows_the_rollout_engine_of_the_resolved_config(changes, engine):
    platform = {"ALIGNFLOW_TRAINER_IMAGE": "registry.corp/trainer:2", "ALIGNFLOW_TRAINER_VLLM_IMAGE": "registry.corp/trainer:2-vllm"}
    params = grpo_params(**changes)
    config = stage_config("grpo", params)
    assert config["rollout"]["engine"] == engine
    image = cluster_options(params, platform, config=config).image
    assert image == {"vllm": "registry.corp/trainer:2-vllm", "auto": "registry.corp/trainer:2-vllm",
                     "hf": "registry.corp/trainer:2"}[engine]
