"""A stand-in for KFP 2.17's MLflow plugin around a kfp.local run: what its API server, drivers and launchers do in
MLflow, and what they put in a task's environment (kubeflow/pipelines 2.17.0).

- The API server opens the pipeline run's MLflow run in the run's experiment (`plugins_input.mlflow`, else
  `KFP-Default`), tagged `kfp.pipeline_run_id` and `kfp.pipeline_run_url`, and gives every task
  `KFP_MLFLOW_CONFIG` (`backend/src/apiserver/plugins/mlflow/handler.go`, `OnBeforeRunCreation`).
- A group's driver (an exit handler, a `dsl.If`) opens a run named after the group's task, nested under its
  parent's, and marks it FINISHED as the driver returns: 2.17.0's DAG driver ends it in a deferred call
  (`backend/src/v2/driver/dag.go`). Tasks inside nest under it (`resolve.go` hands the group's run down).
- A container task's driver opens the task's run the same way (`driver/container.go`); only with
  `injectUserEnvVars` (off by default) does the task get MLFLOW_RUN_ID and the other variables
  (`backend/src/v2/common/plugins/mlflow/handler.go`, `RetrieveUserContainerEnvVars`). The launcher marks the run
  FINISHED or FAILED when the task ends (`OnTaskEnd`). Importers get no run.

KFP's own calls go over MLflow's REST API with the pod's service-account token and the workspace header, as its Go
client does (`backend/src/common/plugins/mlflow/client.go`), so they pass the same gateway as alignflow's
(tests/integration/mlflow_gateway.py). What it leaves out: caching, retries, loops, and closing the runs when the
pipeline run ends (the API server's sweep).
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from pathlib import Path

DEFAULT_EXPERIMENT = "KFP-Default"


class KfpMlflowPlugin:
    """KFP 2.17's MLflow plugin for one pipeline run (see the module docstring).

    Args:
        endpoint: MLflow as KFP's config names it.
        token_file: The pods' service-account token.
        workspace: The run's namespace (workspaces on, as KFP defaults with `kubernetes` auth).
        experiment: `plugins_input.mlflow.experiment_name`; empty: KFP's default experiment.
        inject_user_env_vars: KFP's `injectUserEnvVars` setting (off by default).
    """

    def __init__(self, endpoint: str, token_file: Path, workspace: str, experiment: str = "",
                 inject_user_env_vars: bool = False) -> None:
        self.endpoint = endpoint
        self.token_file = token_file
        self.workspace = workspace
        self.inject_user_env_vars = inject_user_env_vars
        self.experiment_id = self._experiment(experiment or DEFAULT_EXPERIMENT)
        self.kfp_run_id = str(uuid.uuid4())
        self.pipeline_run = self._create_run("kfp-mlflow run", {
            "kfp.pipeline_run_id": self.kfp_run_id,
            "kfp.pipeline_run_url": f"http://kfp.example/#/runs/details/{self.kfp_run_id}"})
        self.runs: dict[str, str] = {}  # task name -> the run KFP opened for it
        self._parents = [self.pipeline_run]  # the group whose tasks are being driven, innermost last
        self._task_env: dict[str, str] = {}

    def _call(self, method: str, path: str, body: dict | None = None) -> dict:
        headers = {"Authorization": f"Bearer {self.token_file.read_text().strip()}",
                   "X-MLflow-Workspace": self.workspace, "Content-Type": "application/json"}
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(f"{self.endpoint}{path}", data=data, method=method, headers=headers)
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read() or b"{}")

    def _experiment(self, name: str) -> str:
        try:
            query = urllib.parse.urlencode({"experiment_name": name})
            return self._call("GET", f"/api/2.0/mlflow/experiments/get-by-name?{query}")["experiment"]["experiment_id"]
        except urllib.error.HTTPError as err:
            if err.code != 404:
                raise
        return self._call("POST", "/api/2.0/mlflow/experiments/create", {"name": name})["experiment_id"]

    def _create_run(self, name: str, tags: dict[str, str]) -> str:
        body = {"experiment_id": self.experiment_id, "run_name": name, "start_time": int(time.time() * 1000),
                "tags": [{"key": key, "value": value} for key, value in tags.items()]}
        return self._call("POST", "/api/2.0/mlflow/runs/create", body)["run"]["info"]["run_id"]

    def _end_run(self, run_id: str, status: str) -> None:
        self._call("POST", "/api/2.0/mlflow/runs/update",
                   {"run_id": run_id, "status": status, "end_time": int(time.time() * 1000)})

    def config(self) -> dict:
        """KFP_MLFLOW_CONFIG as the API server writes it (backend/src/common/plugins/mlflow/config.go)."""
        config = {"endpoint": self.endpoint, "workspacesEnabled": True, "workspace": self.workspace,
                  "parentRunId": self.pipeline_run, "experimentId": self.experiment_id, "authType": "kubernetes",
                  "timeout": "30s"}
        return config | ({"injectUserEnvVars": True} if self.inject_user_env_vars else {})

    def _open_task_run(self, task_name: str) -> str:
        run_id = self._create_run(task_name, {"mlflow.parentRunId": self._parents[-1]})
        self.runs[task_name] = run_id
        return run_id

    def install(self, monkeypatch) -> None:
        """Drive kfp.local's tasks as KFP's drivers and launchers would, for the rest of the test."""
        from kfp.local import status, subprocess_task_handler
        from kfp.local.orchestrator import enhanced_dag_orchestrator

        plugin = self
        execute_task = enhanced_dag_orchestrator.execute_task
        run_subprocess = subprocess_task_handler.SubprocessTaskHandler.run

        def drive(task_name, task_spec, pipeline_resource_name, components, executors, *args, **kwargs):
            component = components[task_spec.component_ref.name]
            if component.WhichOneof("implementation") == "dag":  # a group: its driver opens and ends its run
                run_id = plugin._open_task_run(task_name)
                plugin._end_run(run_id, "FINISHED")
                plugin._parents.append(run_id)
                try:
                    return execute_task(task_name, task_spec, pipeline_resource_name, components, executors, *args,
                                        **kwargs)
                finally:
                    plugin._parents.pop()
            if executors[component.executor_label].WhichOneof("spec") != "container":
                return execute_task(task_name, task_spec, pipeline_resource_name, components, executors, *args,
                                    **kwargs)  # an importer: no run
            run_id = plugin._open_task_run(task_name)
            plugin._task_env = {"KFP_MLFLOW_CONFIG": json.dumps(plugin.config())}
            if plugin.inject_user_env_vars:
                plugin._task_env |= {"MLFLOW_RUN_ID": run_id, "MLFLOW_TRACKING_URI": plugin.endpoint,
                                     "MLFLOW_EXPERIMENT_ID": plugin.experiment_id, "MLFLOW_WORKSPACE": plugin.workspace,
                                     "MLFLOW_TRACKING_AUTH": "kubernetes-namespaced"}
            outcome = (None, status.Status.FAILURE)
            try:
                outcome = execute_task(task_name, task_spec, pipeline_resource_name, components, executors, *args,
                                       **kwargs)
                return outcome
            finally:
                plugin._end_run(run_id, "FINISHED" if outcome[1] == status.Status.SUCCESS else "FAILED")

        def run_task(handler):
            handler.env_vars = {**handler.env_vars, **plugin._task_env}
            return run_subprocess(handler)

        monkeypatch.setattr(enhanced_dag_orchestrator, "execute_task", drive)
        monkeypatch.setattr(subprocess_task_handler.SubprocessTaskHandler, "run", run_task)
