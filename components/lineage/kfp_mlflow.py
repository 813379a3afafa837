"""KFP's own MLflow integration (KFP 2.17, KEP-12862) as a task sees it, so alignflow's runs join KFP's tree.

Where a platform turns the integration on, KFP's API server opens one MLflow run per pipeline run (tagged
`kfp.pipeline_run_id`), KFP's driver opens one nested run per task (tag `mlflow.parentRunId` = the pipeline's run,
named after the task) before the task starts, and the task's container gets (kubeflow/pipelines
`backend/src/v2/common/plugins/mlflow/handler.go`, `RetrieveUserContainerEnvVars`):
`MLFLOW_RUN_ID` (the task's nested run), `MLFLOW_TRACKING_URI`, `MLFLOW_EXPERIMENT_ID`, with `MLFLOW_WORKSPACE` and
`MLFLOW_TRACKING_AUTH` or credentials where configured. KFP's launcher marks the task's run finished or failed
when the task ends, and the API server the pipeline's run when the pipeline run ends.

So on such a cluster alignflow opens no parent run of its own: `open_lineage` puts the lineage (tags, params,
dataset inputs) on KFP's pipeline run, each stage's run nests under the run KFP made for the stage's task, and
the exit handler leaves closing to KFP. Without `MLFLOW_RUN_ID` (the integration off, kfp.local, the CLI) nothing
here applies and alignflow opens and closes its own parent run as before.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from trainer.errors import PipelineError

PARENT_TAG = "mlflow.parentRunId"


@dataclass(frozen=True, slots=True)
class KfpTaskRun:
    """The MLflow run KFP opened for this task, and where it is."""

    run_id: str
    experiment_id: str
    tracking_uri: str


def kfp_task_run(environ: Mapping[str, str] | None = None) -> KfpTaskRun | None:
    """The task's KFP-made run, or None when KFP's MLflow integration is off (no `MLFLOW_RUN_ID`).

    Raises:
        PipelineError: `MLFLOW_RUN_ID` is set without the experiment or tracking URI KFP injects beside it.
    """
    environ = os.environ if environ is None else environ
    run_id = (environ.get("MLFLOW_RUN_ID") or "").strip()
    if not run_id:
        return None
    missing = [name for name in ("MLFLOW_EXPERIMENT_ID", "MLFLOW_TRACKING_URI") if not environ.get(name, "").strip()]
    if missing:
        raise PipelineError(f"MLFLOW_RUN_ID is set (KFP's MLflow integration) but {' and '.join(missing)} is not; "
                            "KFP injects all three together (check the task's pod environment)")
    return KfpTaskRun(run_id, environ["MLFLOW_EXPERIMENT_ID"].strip(), environ["MLFLOW_TRACKING_URI"].strip())


def kfp_pipeline_run(client, task: KfpTaskRun) -> str:
    """The pipeline's run KFP opened: the parent of the task's run.

    Raises:
        PipelineError: The task's run has no parent (it was not made by KFP's driver).
    """
    parent = client.get_run(task.run_id).data.tags.get(PARENT_TAG)
    if not parent:
        raise PipelineError(f"MLflow run {task.run_id} (MLFLOW_RUN_ID) has no {PARENT_TAG} tag: it is not a task "
                            "run KFP's MLflow integration opened, so the pipeline's run cannot be found")
    return parent


def stage_job_env(parent_run_id: str, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment for a stage's training job: its run nests under KFP's task run when the integration is on
    (in KFP's experiment, on KFP's server), else under `parent_run_id` (alignflow's pipeline run; "" for none)."""
    task = kfp_task_run(environ)
    if task is None:
        return {"ALIGNFLOW_PARENT_RUN_ID": parent_run_id} if parent_run_id else {}
    # MLFLOW_RUN_ID is emptied: the stage opens a run of its own (a local job would otherwise inherit the task's).
    return {"ALIGNFLOW_PARENT_RUN_ID": task.run_id, "MLFLOW_EXPERIMENT_ID": task.experiment_id,
            "MLFLOW_TRACKING_URI": task.tracking_uri, "MLFLOW_RUN_ID": ""}
