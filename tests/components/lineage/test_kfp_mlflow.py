"""Reading KFP's MLflow integration from a task's environment (kfp_mlflow.py); the whole tree is checked on
kfp.local against a real MLflow server behind KFP 2.17's default auth in tests/integration/test_kfp_mlflow.py."""

from __future__ import annotations

import json
import logging
import os
from types import SimpleNamespace

import pytest

from components.lineage.kfp_mlflow import KfpMlflow, find_task_run, read_kfp_mlflow, stage_job_env
from trainer.errors import PipelineError

# KFP_MLFLOW_CONFIG as KFP 2.17's API server writes it at its defaults (`kubernetes` auth, workspaces on, no user
# env): backend/src/common/plugins/mlflow/config.go, MLflowRuntimeConfig.
CONFIG = {"endpoint": "http://mlflow.kubeflow:5000", "workspacesEnabled": True, "workspace": "team-a",
          "parentRunId": "pipeline-run", "experimentId": "7", "authType": "kubernetes", "timeout": "30s"}
KFP_ENV = {"KFP_MLFLOW_CONFIG": json.dumps(CONFIG)}


def test_the_integration_is_read_from_kfps_config_whether_or_not_it_injects_the_task_run():
    assert read_kfp_mlflow(KFP_ENV) == KfpMlflow("http://mlflow.kubeflow:5000", "7", "pipeline-run", "kubernetes",
                                                 "team-a")
    injected = read_kfp_mlflow({**KFP_ENV, "MLFLOW_RUN_ID": "task-run"})  # injectUserEnvVars on
    assert injected.task_run_id == "task-run"
    assert read_kfp_mlflow({"MLFLOW_TRACKING_URI": "http://mlflow:5000", "MLFLOW_RUN_ID": "r"}) is None  # off


def test_a_config_kfp_would_not_write_is_an_error_naming_what_is_wrong():
    with pytest.raises(PipelineError, match="KFP_MLFLOW_CONFIG lacks parentRunId, authType"):
        read_kfp_mlflow({"KFP_MLFLOW_CONFIG": json.dumps({"endpoint": "http://m", "experimentId": "1"})})
    with pytest.raises(PipelineError, match="KFP_MLFLOW_CONFIG is not JSON"):
        read_kfp_mlflow({"KFP_MLFLOW_CONFIG": "endpoint=http://m"})


@pytest.mark.parametrize(("auth", "workspace", "expected"), [
    ("kubernetes", "team-a", {"MLFLOW_TRACKING_AUTH": "kubernetes-namespaced", "MLFLOW_WORKSPACE": "team-a"}),
    ("kubernetes", "", {"MLFLOW_TRACKING_AUTH": "kubernetes"}),
    ("bearer", "team-a", {"MLFLOW_WORKSPACE": "team-a"}),  # the token comes from a Secret, not from here
    ("none", "", {}),
])
def test_the_mlflow_client_authenticates_as_kfps_driver_would_set_it_up(auth, workspace, expected):
    config = {**CONFIG, "authType": auth, "workspace": workspace, "workspacesEnabled": bool(workspace)}
    kfp = read_kfp_mlflow({"KFP_MLFLOW_CONFIG": json.dumps(config)})
    assert kfp.client_environment() == {"MLFLOW_TRACKING_URI": "http://mlflow.kubeflow:5000", **expected}


class TreeClient:
    """An MLflow client over a fixed tree of runs: {run id: (run name, parent run id)}."""

    def __init__(self, runs: dict[str, tuple[str, str]]) -> None:
        self.runs = runs

    def get_run(self, run_id: str):
        return SimpleNamespace(data=SimpleNamespace(tags={"mlflow.parentRunId": self.runs[run_id][1]}))

    def search_runs(self, experiments, filter_string, max_results):
        name = filter_string.split("'")[1]
        return [SimpleNamespace(info=SimpleNamespace(run_id=run)) for run, (run_name, _) in self.runs.items()
                if run_name == name]


# KFP 2.17 nests a task's run under the runs of the groups around it: exit handler, then the `If`.
TREE = {"pipeline-run": ("rlhf-dpo 2026-12-01", ""), "exit": ("exit-handler-1", "pipeline-run"),
        "gate": ("condition-2", "exit"), "train": ("train-sft", "gate"),
        "other-pipeline": ("rlhf-dpo 2026-11-30", ""), "other-train": ("train-sft", "other-pipeline")}


def test_the_task_run_is_the_one_of_its_name_below_this_pipelines_run_however_deep():
    kfp = read_kfp_mlflow(KFP_ENV)
    assert find_task_run(TreeClient(TREE), kfp, "train-sft") == "train"


def test_without_a_single_run_of_its_name_the_stage_nests_under_the_pipelines_run():
    kfp = read_kfp_mlflow(KFP_ENV)
    looped = {**TREE, "train-2": ("train-sft", "exit")}  # a loop runs the task twice
    assert find_task_run(TreeClient(looped), kfp, "train-sft") == "pipeline-run"
    assert find_task_run(TreeClient(TREE), kfp, "") == "pipeline-run"  # a pipeline that passed no task name
    assert find_task_run(TreeClient(TREE), kfp, "evaluate-model") == "pipeline-run"


def test_a_stage_job_gets_kfps_server_experiment_workspace_and_auth_or_else_the_pipelines_run():
    env = stage_job_env("pipeline-run", "train-sft", environ={**KFP_ENV, "MLFLOW_RUN_ID": "task-run"})
    assert env == {"MLFLOW_TRACKING_URI": "http://mlflow.kubeflow:5000", "MLFLOW_TRACKING_AUTH": "kubernetes-namespaced",
                   "MLFLOW_WORKSPACE": "team-a", "ALIGNFLOW_PARENT_RUN_ID": "task-run", "MLFLOW_EXPERIMENT_ID": "7",
                   "MLFLOW_RUN_ID": ""}
    assert stage_job_env("pipeline-run", "train-sft", environ={}) == {"ALIGNFLOW_PARENT_RUN_ID": "pipeline-run"}
    assert stage_job_env("", environ={}) == {}


def test_kubernetes_auth_without_a_token_for_the_pods_is_said_once_at_launch(caplog):
    environ = {**KFP_ENV, "MLFLOW_RUN_ID": "task-run"}
    with caplog.at_level(logging.WARNING):
        stage_job_env("pipeline-run", "train-sft", has_token=True, environ=environ)
        assert not caplog.records
        stage_job_env("pipeline-run", "train-sft", has_token=False, environ=environ)
    [record] = caplog.records
    assert "ALIGNFLOW_MLFLOW_TOKEN_AUDIENCE" in record.getMessage()


def test_an_mlflow_that_cannot_be_asked_leaves_the_stage_under_the_pipelines_run(monkeypatch, caplog):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    config = {**CONFIG, "endpoint": "http://127.0.0.1:9"}  # nothing listens there
    with caplog.at_level(logging.WARNING):
        env = stage_job_env("pipeline-run", "train-sft", environ={"KFP_MLFLOW_CONFIG": json.dumps(config)})
    assert env["ALIGNFLOW_PARENT_RUN_ID"] == "pipeline-run"
    assert "cannot look up KFP's MLflow run for task train-sft" in caplog.text
    assert "MLFLOW_TRACKING_AUTH" not in os.environ  # the lookup's settings did not outlive it
