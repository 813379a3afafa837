"""Scheduling in the compiled pipelines: one `scheduling` run parameter reaches every job-launching task, and every
component pod gets the chart's scheduling keys from the defaults ConfigMap."""

from __future__ import annotations

import pytest
import yaml

from pipelines.options import DEFAULTS_KEYS

SCHEDULING_KEYS = {"ALIGNFLOW_AFFINITY", "ALIGNFLOW_CPU_REQUEST", "ALIGNFLOW_CPU_LIMIT", "ALIGNFLOW_MEMORY_REQUEST",
                   "ALIGNFLOW_MEMORY_LIMIT", "ALIGNFLOW_SHM_SIZE", "ALIGNFLOW_ACTIVE_DEADLINE_SECONDS",
                   "ALIGNFLOW_PENDING_TIMEOUT_SECONDS", "ALIGNFLOW_S3_RETRY_SECONDS"}


def compiled(name: str, tmp_path) -> tuple[dict, dict]:
    from kfp import compiler

    from pipelines.catalog import get_pipeline

    package = tmp_path / f"{name}.yaml"
    compiler.Compiler().compile(get_pipeline(name), str(package))
    pipeline, platform = list(yaml.safe_load_all(package.read_text()))
    return pipeline, platform


@pytest.mark.parametrize("name", ["rlhf-dpo", "rlhf-ppo", "rlhf-grpo"])
def test_every_job_launching_task_takes_the_runs_scheduling_parameter(name, tmp_path):
    pipeline, platform = compiled(name, tmp_path)
    assert pipeline["root"]["inputDefinitions"]["parameters"]["scheduling"]["defaultValue"] == {}
    tasks = {task_name: task for component in pipeline["components"].values()
             for task_name, task in component.get("dag", {}).get("tasks", {}).items()}
    # The evaluation's job runs on GPU nodes too, so it takes the same overrides as the training stages.
    training = {task_name: task for task_name, task in tasks.items()
                if task_name.startswith("train-") or task_name == "evaluate-model"}
    assert len(training) >= 3 and "evaluate-model" in training
    for task_name, task in training.items():
        # Inside the exit handler's sub-DAG the pipeline's parameter arrives as a `pipelinechannel--` input.
        assert task["inputs"]["parameters"]["scheduling"] == {
            "componentInputParameter": "pipelinechannel--scheduling"}, task_name
    executors = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    for executor_name, executor in executors.items():
        mapped = {entry["configMapKey"] for item in executor.get("configMapAsEnv", [])
                  for entry in item.get("keyToEnv", [])}
        assert SCHEDULING_KEYS <= mapped, (executor_name, SCHEDULING_KEYS - mapped)


def test_the_scheduling_keys_are_among_those_every_pod_gets():
    assert SCHEDULING_KEYS <= set(DEFAULTS_KEYS)
