"""The `TrainerClient.train` arguments that run a stage outside KFP are the launcher's own TrainJob, named as asked.

The call itself runs a stage on the emulated cluster in tests/cluster/test_sdk_train.py.
"""

from __future__ import annotations

import pytest

from components.launcher.kinds.trainjob.request import build_trainjob_request
from components.launcher.kinds.trainjob.sdk_call import stage_trainjob_arguments
from components.launcher.stage_job import ClusterOptions, stage_spec
from trainer.errors import LaunchError

CLUSTER = ClusterOptions(mode="kubernetes", image="ghcr.io/alignflow/trainer:1", namespace="team", s3_secret="s3",
                         nproc_per_node=2, env={"AWS_ENDPOINT_URL": "http://minio:9000"})


def options_of(arguments: dict) -> dict[str, object]:
    return {type(option).__name__: option for option in arguments["options"]}


def test_the_arguments_run_the_stage_as_a_component_would_under_the_given_name():
    arguments = stage_trainjob_arguments("sft", "s3://bucket/sft.yaml", CLUSTER, name="my-sft")
    assert set(arguments) == {"trainer", "options", "initializer"} and arguments["initializer"] is None
    options = options_of(arguments)
    assert options["Name"].name == "my-sft"
    assert options["TrainerCommand"].command == ["python", "-m", "trainer.launch", "--nproc-per-node", "2", "-m",
                                                 "trainer", "sft", "--config", "s3://bucket/sft.yaml"]
    assert options["Labels"].labels["alignflow/run"] == "my-sft"  # what the exit handler and `kubectl -l` find
    env = arguments["trainer"].env
    assert env["ALIGNFLOW_PIPELINE_RUN_ID"] == "my-sft" and env["AWS_ENDPOINT_URL"] == "http://minio:9000"
    assert env["ALIGNFLOW_SECRET_ENV_DIRS"] == "/var/run/secrets/alignflow/s3"  # the Secret as files, no values
    # Everything else is the launcher's TrainJob for the same stage.
    launcher = build_trainjob_request(stage_spec("sft", "s3://bucket/sft.yaml", "my-sft", "sft", CLUSTER))
    assert arguments["trainer"] == launcher.trainer
    assert [type(option).__name__ for option in arguments["options"]] == \
           [type(option).__name__ for option in launcher.options]
    assert options["RuntimePatch"] == options_of({"options": launcher.options})["RuntimePatch"]


def test_the_stage_configs_grace_period_reaches_the_pods():
    arguments = stage_trainjob_arguments("dpo", "s3://bucket/dpo.yaml", CLUSTER, name="my-dpo",
                                         config={"checkpoint": {"preemption_grace_seconds": 50}})
    assert options_of(arguments)["PodFields"].fields["terminationGracePeriodSeconds"] == 60


def test_invalid_job_values_fail_before_anything_is_created():
    cluster = ClusterOptions(mode="kubernetes", image="ghcr.io/alignflow/trainer:1", namespace="team",
                             env={"PET_NNODES": "2"})
    with pytest.raises(LaunchError, match="env PET_NNODES is set by Kubeflow Trainer's torch plugin"):
        stage_trainjob_arguments("sft", "s3://bucket/sft.yaml", cluster, name="my-sft")


def test_the_initializers_plan_reaches_the_trainjob():
    """With the platform's initializers, `stage_initializers` gives the config to upload and the initializer to
    pass on (docs/kubeflow.md, "Initializers")."""
    from components.launcher.stage_job import stage_initializers

    cluster = ClusterOptions(**{**{name: getattr(CLUSTER, name) for name in CLUSTER.__slots__}, "initializers": True})
    config, initializer = stage_initializers({"model": {"path": "hf://org/tiny"}, "data": {"train_path": "/d.jsonl"}},
                                             cluster, "TrainJob")
    assert config["model"]["path"] == "/workspace/model"
    arguments = stage_trainjob_arguments("dpo", "s3://bucket/dpo.yaml", cluster, name="my-dpo",
                                         initializer=initializer)
    assert arguments["initializer"].model.storage_uri == "hf://org/tiny" and arguments["initializer"].dataset is None
