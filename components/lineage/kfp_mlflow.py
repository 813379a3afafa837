"""KFP's own MLflow integration (KFP 2.17, KEP-12862) as a task sees it, so alignflow's runs join KFP's one tree.

What KFP does, from its source (kubeflow/pipelines 2.17.0):

- The API server opens one MLflow run per pipeline run, tagged `kfp.pipeline_run_id` and `kfp.pipeline_run_url`
  (`backend/src/apiserver/plugins/mlflow/handler.go`, `OnBeforeRunCreation`), and puts `KFP_MLFLOW_CONFIG` on the
  driver and launcher containers of every task (`config.go`, `InjectMLflowRuntimeEnv`). The launcher container is
  the task's own: KFP's launcher starts the component's Python as a child process with its environment
  (`backend/src/v2/component/launcher_v2.go`), so a component always sees it. It is JSON (`MLflowRuntimeConfig`,
  `backend/src/common/plugins/mlflow/config.go`): `endpoint`, `experimentId`, `parentRunId` (the pipeline's run),
  `authType` (`kubernetes` by default, `bearer`, `basic-auth`, `none`), `workspace` and `workspacesEnabled` (on by
  default with `kubernetes` auth; the workspace is the run's namespace), `timeout`, `injectUserEnvVars`.
- Each driver opens a nested run named after its task (tag `mlflow.parentRunId`; `backend/src/v2/driver/
  container.go` and `dag.go`, `OnTaskStart` in `backend/src/v2/common/plugins/mlflow/handler.go`): a container
  task's run, and a run for each group (an exit handler, a `dsl.If`, a loop), whose tasks nest under it. So a task
  inside the exit handler and an `If` sits three levels below the pipeline's run.
- Only with `injectUserEnvVars` (off by default) does a task get `MLFLOW_RUN_ID` (its run), `MLFLOW_TRACKING_URI`,
  `MLFLOW_EXPERIMENT_ID`, `MLFLOW_WORKSPACE` and `MLFLOW_TRACKING_AUTH` (`RetrieveUserContainerEnvVars`).
- KFP's own calls send the pod's service-account token as a bearer token and `X-MLflow-Workspace: <workspace>`
  (`backend/src/common/plugins/mlflow/client.go`, `applyHeaders`); so must alignflow's, from the component and from
  the stage's training pods.

So where `KFP_MLFLOW_CONFIG` is set, alignflow opens no parent run of its own: the lineage goes on KFP's pipeline
run, a stage's run nests under its task's run (MLFLOW_RUN_ID where KFP gives it, else found by the task's name
below the pipeline's run: `find_task_run`), and KFP closes its runs. Without it (the integration off, kfp.local,
the CLI) nothing here applies and alignflow opens and closes its own parent run.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

from trainer.errors import PipelineError

logger = logging.getLogger(__name__)

CONFIG_VARIABLE = "KFP_MLFLOW_CONFIG"
PARENT_TAG = "mlflow.parentRunId"
REQUIRED_FIELDS = ("endpoint", "experimentId", "parentRunId", "authType")
MAX_NESTING = 16  # group runs between a task's run and the pipeline's; KFP nests one per enclosing group


@dataclass(frozen=True, slots=True)
class KfpMlflow:
    """What KFP's MLflow integration told this task (`KFP_MLFLOW_CONFIG`, and `MLFLOW_RUN_ID` where injected)."""

    endpoint: str
    experiment_id: str
    pipeline_run_id: str
    """The run KFP's API server opened for the pipeline run (`parentRunId`)."""
    auth_type: str
    workspace: str = ""
    """The MLflow workspace (the run's namespace); empty when workspaces are off."""
    task_run_id: str = ""
    """The run KFP's driver opened for this task, where KFP injects it (`injectUserEnvVars`); else empty."""

    @property
    def tracking_auth(self) -> str:
        """`MLFLOW_TRACKING_AUTH` for KFP's `kubernetes` auth, as KFP's driver would set it; empty otherwise."""
        if self.auth_type != "kubernetes":
            return ""
        return "kubernetes-namespaced" if self.workspace else "kubernetes"

    def client_environment(self) -> dict[str, str]:
        """The MLflow client's settings for KFP's server: where it is, how to authenticate, which workspace.
        Credentials of `bearer` and `basic-auth` are not here: KFP gives them as Secret references."""
        env = {"MLFLOW_TRACKING_URI": self.endpoint}
        if self.tracking_auth:
            env["MLFLOW_TRACKING_AUTH"] = self.tracking_auth
        if self.workspace:
            env["MLFLOW_WORKSPACE"] = self.workspace
        return env


def read_kfp_mlflow(environ: Mapping[str, str] | None = None) -> KfpMlflow | None:
    """KFP's MLflow integration as this task's environment describes it, or None where it is off.

    Raises:
        PipelineError: `KFP_MLFLOW_CONFIG` is not a JSON object with the fields KFP always writes.
    """
    environ = os.environ if environ is None else environ
    text = (environ.get(CONFIG_VARIABLE) or "").strip()
    if not text:
        return None
    try:
        config = json.loads(text)
    except ValueError as err:
        raise PipelineError(f"{CONFIG_VARIABLE} is not JSON ({err}); KFP's API server writes it") from err
    missing = [name for name in REQUIRED_FIELDS if not isinstance(config, dict) or not config.get(name)]
    if missing:
        raise PipelineError(f"{CONFIG_VARIABLE} lacks {', '.join(missing)}, which KFP's API server always writes")
    # The API server writes a workspace only where workspaces are on, and KFP's own client sends the header only
    # where there is one (backend/src/common/plugins/mlflow/client.go): the workspace alone decides.
    return KfpMlflow(endpoint=config["endpoint"], experiment_id=str(config["experimentId"]),
                     pipeline_run_id=config["parentRunId"], auth_type=config["authType"],
                     workspace=str(config.get("workspace") or ""),
                     task_run_id=(environ.get("MLFLOW_RUN_ID") or "").strip())


def use_kfp_mlflow_auth(kfp: KfpMlflow) -> None:
    """Authenticate this process's MLflow calls as KFP's own are (auth mode and workspace), where it is not yet
    set: MLflow reads both from the environment for every request, and without `injectUserEnvVars` KFP sets
    neither in the task."""
    for name, value in kfp.client_environment().items():
        if name != "MLFLOW_TRACKING_URI":  # the caller points its client at the endpoint itself
            os.environ.setdefault(name, value)


@contextmanager
def kfp_mlflow_auth(kfp: KfpMlflow) -> Iterator[None]:
    """`use_kfp_mlflow_auth` for the calls inside, the environment as it was after: a stage's local job inherits
    this process's environment, and must get its MLflow settings from `stage_job_env` alone, as a pod does."""
    saved = dict(os.environ)
    use_kfp_mlflow_auth(kfp)
    try:
        yield
    finally:
        for name in set(os.environ) - set(saved):
            del os.environ[name]


def descends_from(client, run_id: str, ancestor: str) -> bool:
    """Whether MLflow run `run_id` is nested, at any depth up to MAX_NESTING, under run `ancestor`."""
    for _ in range(MAX_NESTING):
        run_id = client.get_run(run_id).data.tags.get(PARENT_TAG, "")
        if not run_id:
            return False
        if run_id == ancestor:
            return True
    return False


def find_task_run(client, kfp: KfpMlflow, task_name: str) -> str:
    """The run KFP's driver opened for this task: `MLFLOW_RUN_ID` where KFP injects it, else the one run below the
    pipeline's run named after the task (`dsl.PIPELINE_TASK_NAME_PLACEHOLDER`, the name KFP's driver gives it).

    Where the task's name is unknown, or names no single run (a loop runs the task once per item), the stage's run
    goes under the pipeline's run: still in KFP's tree, never a second parent.
    """
    if kfp.task_run_id:
        return kfp.task_run_id
    if task_name:
        quoted = task_name.replace("'", "\\'")
        runs = client.search_runs([kfp.experiment_id], f"attributes.run_name = '{quoted}'", max_results=50)
        found = [run.info.run_id for run in runs if descends_from(client, run.info.run_id, kfp.pipeline_run_id)]
        if len(found) == 1:
            return found[0]
        logger.info("%d MLflow runs named %s below KFP's pipeline run %s: this stage's run nests under the pipeline's",
                    len(found), task_name, kfp.pipeline_run_id)
    return kfp.pipeline_run_id


def stage_job_env(parent_run_id: str, task_name: str = "", *, has_token: bool = True,
                  environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment for a stage's training job: its run nests under KFP's run for this task, on KFP's server, in
    KFP's experiment and workspace, with KFP's auth mode, where the integration is on; else under `parent_run_id`
    (alignflow's pipeline run; "" for none).

    Args:
        parent_run_id: The pipeline's MLflow run from `open_lineage`.
        task_name: This task's name in the pipeline run (`dsl.PIPELINE_TASK_NAME_PLACEHOLDER`); "" when not given.
        has_token: Whether the job's pods can show MLflow a service-account token (the platform's
            `ALIGNFLOW_MLFLOW_TOKEN_AUDIENCE`, or a local job, which runs beside this pod's own token).
        environ: Where KFP's variables are read (default: this process).
    """
    kfp = read_kfp_mlflow(environ)
    if kfp is None:
        return {"ALIGNFLOW_PARENT_RUN_ID": parent_run_id} if parent_run_id else {}
    task_run = kfp.task_run_id
    if not task_run:
        from mlflow import MlflowClient

        try:
            with kfp_mlflow_auth(kfp):
                task_run = find_task_run(MlflowClient(tracking_uri=kfp.endpoint), kfp, task_name)
        except Exception as err:  # noqa: BLE001 - an MLflow outage must not stop training: the tree's root holds it
            from trainer.redact import redact_text

            logger.warning("cannot look up KFP's MLflow run for task %s (%s); the stage's run nests under the "
                           "pipeline's run", task_name, redact_text(str(err)))
            task_run = kfp.pipeline_run_id
    if kfp.auth_type == "kubernetes" and not has_token:
        logger.warning("KFP's MLflow integration uses `kubernetes` auth, and this platform gives training pods no "
                       "service-account token for MLflow (ALIGNFLOW_MLFLOW_TOKEN_AUDIENCE, the chart's "
                       "mlflow.tokenAudience, is empty): the stage's MLflow run will be refused and tracking turned "
                       "off; its metrics stay in metrics.jsonl and the KFP outputs")
    # MLFLOW_RUN_ID is emptied: the stage opens a run of its own (a local job would otherwise inherit the task's).
    return {**kfp.client_environment(), "ALIGNFLOW_PARENT_RUN_ID": task_run, "MLFLOW_EXPERIMENT_ID": kfp.experiment_id,
            "MLFLOW_RUN_ID": ""}
