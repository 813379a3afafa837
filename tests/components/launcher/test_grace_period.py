"""The pods' grace period follows the stage config: a longer `checkpoint.preemption_grace_seconds`
gives the pods that plus a margin, and torchrun's agent waits as long before it kills its workers."""

from __future__ import annotations

import pytest

from components.launcher.kinds.pytorchjob.manifest import build_pytorchjob
from components.launcher.stage_job import PREEMPTION_MARGIN_SECONDS, ClusterOptions, stage_spec
from tests.components.launcher.crd import pytorchjob_validator
from trainer.errors import ConfigError


def pod_of(job: dict) -> dict:
    (replica,) = job["spec"]["pytorchReplicaSpecs"].values()
    return replica["template"]["spec"]


def job_for(config: dict | None, **cluster) -> dict:
    options = ClusterOptions(mode="kubernetes", image="registry/alignflow-trainer:1", namespace="ml", **cluster)
    return build_pytorchjob(stage_spec("sft", "s3://runs/r/sft.yaml", "run-1", "sft", options, config=config))


def shutdown_timeout(pod: dict) -> str:
    return next(item["value"] for item in pod["containers"][0]["env"] if item["name"] == "TORCH_ELASTIC_SHUTDOWN_TIMEOUT")


def test_a_longer_preemption_grace_lengthens_the_pods_grace_period_by_the_margin():
    job = job_for({"checkpoint": {"preemption_grace_seconds": 90, "save_interval": 100}})
    pytorchjob_validator().validate(job)
    pod = pod_of(job)
    assert PREEMPTION_MARGIN_SECONDS >= 5  # room for the workers' and torchrun's exit after the trainer's grace
    assert pod["terminationGracePeriodSeconds"] == 90 + PREEMPTION_MARGIN_SECONDS
    assert shutdown_timeout(pod) == str(90 + PREEMPTION_MARGIN_SECONDS)  # torchrun never kills a saving worker first


@pytest.mark.parametrize("config", [None, {}, {"checkpoint": {"save_interval": 5}}])
def test_the_default_config_gives_the_default_grace_period(config):
    pod = pod_of(job_for(config))
    assert pod["terminationGracePeriodSeconds"] == 30  # 20 s (the trainer's default) + 10, Kubernetes' default
    assert shutdown_timeout(pod) == "30"


def test_the_grace_period_is_rounded_up_and_never_below_the_configured_one():
    assert pod_of(job_for({"checkpoint": {"preemption_grace_seconds": 20.5}}))["terminationGracePeriodSeconds"] == 31
    long = job_for({"checkpoint": {"preemption_grace_seconds": 90}}, termination_grace_period_seconds=600)
    assert pod_of(long)["terminationGracePeriodSeconds"] == 600
    short = job_for({"checkpoint": {"preemption_grace_seconds": 1}})
    assert pod_of(short)["terminationGracePeriodSeconds"] == 30


@pytest.mark.parametrize("value", [0, -5, "soon", True])
def test_a_bad_preemption_grace_is_one_error_naming_the_key(value):
    with pytest.raises(ConfigError, match=r"^checkpoint.preemption_grace_seconds is .*, expected a number of "
                                          r"seconds > 0$"):
        job_for({"checkpoint": {"preemption_grace_seconds": value}})

