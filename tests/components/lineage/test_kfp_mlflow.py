"""Reading KFP's MLflow integration from a task's environment (kfp_mlflow.py); the whole tree is checked on
kfp.local against a real MLflow server in tests/integration/test_kfp_mlflow.py."""

from __future__ import annotations

import pytest

from components.lineage.kfp_mlflow import KfpTaskRun, kfp_task_run, stage_job_env
from trainer.errors import PipelineError

# What KFP 2.17's driver gives a task's container (backend/src/v2/common/plugins/mlflow/handler.go).
KFP_ENV = {"MLFLOW_RUN_ID": "task-run", "MLFLOW_TRACKING_URI": "http://mlflow.kubeflow:5000",
           "MLFLOW_EXPERIMENT_ID": "7", "MLFLOW_TRACKING_AUTH": "kubernetes"}


def test_the_task_run_is_read_from_what_kfp_injects():
    assert kfp_task_run(KFP_ENV) == KfpTaskRun("task-run", "7", "http://mlflow.kubeflow:5000")
    assert kfp_task_run({"MLFLOW_TRACKING_URI": "http://mlflow:5000"}) is None  # the integration is off


def test_a_run_id_without_its_companions_is_an_error_naming_them():
    with pytest.raises(PipelineError, match="MLFLOW_EXPERIMENT_ID and MLFLOW_TRACKING_URI is not"):
        kfp_task_run({"MLFLOW_RUN_ID": "r"})


def test_a_stage_job_nests_under_kfps_task_run_or_else_the_pipelines_run():
    assert stage_job_env("pipeline-run", KFP_ENV) == {
        "ALIGNFLOW_PARENT_RUN_ID": "task-run", "MLFLOW_EXPERIMENT_ID": "7",
        "MLFLOW_TRACKING_URI": "http://mlflow.kubeflow:5000", "MLFLOW_RUN_ID": ""}
    assert stage_job_env("pipeline-run", {}) == {"ALIGNFLOW_PARENT_RUN_ID": "pipeline-run"}
    assert stage_job_env("", {}) == {}
