"""Creating a run or a recurring run that names its MLflow experiment (`plugins_input`), which `kfp.Client` cannot.

KFP 2.17's API takes `plugins_input` on a run, and on a recurring run, whose controller hands it to every run it
starts (KEP-12862). KFP's MLflow plugin reads `plugins_input.mlflow`, whose schema is
`{experiment_name?, experiment_id?, disabled?}` and nothing else (kubeflow/pipelines
`backend/src/apiserver/plugins/mlflow/config.go`, `ResolveMLflowPluginInput`), and opens the run's MLflow run in
that experiment; without it the run lands in the platform's `defaultExperimentName`, else `KFP-Default`
(`SelectMLflowExperiment`). So `alignflow submit --experiment NAME` (and `schedule`) names the KFP experiment and
the MLflow experiment alike.

kfp 2.17.3's `Client` has no argument for the field: `create_run_from_pipeline_package` and
`create_recurring_run` build the request body themselves. Here the body is built from the same parts, the client's
own `_create_job_config` (the compiled package's spec, the parameters, the pipeline root), with `plugins_input`
added, and sent through the client's own generated API, so its host, authentication and namespace stay as they are.

An API server before 2.17 refuses a request with the field (it decodes JSON with unknown fields as errors:
`backend/src/apiserver/common/utils.go`, `CustomMarshaler`). A refused create made nothing, so it is sent once
more without the field, with one warning; those servers have no MLflow plugin to read it anyway.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

# The recurring run's defaults, as `Client.create_recurring_run` has them: one run at a time, catching up.
MAX_CONCURRENCY = 1


def mlflow_plugins_input(experiment: str) -> dict[str, dict[str, str]]:
    """`plugins_input` that puts the run's MLflow runs in MLflow experiment `experiment`."""
    return {"mlflow": {"experiment_name": experiment}}


def is_plugins_input_refused(err: Exception) -> bool:
    """Whether `err` is an API server that predates `plugins_input` refusing the field (HTTP 400 naming it)."""
    body = getattr(err, "body", None) or b""
    text = body.decode(errors="replace") if isinstance(body, bytes) else str(body)
    return getattr(err, "status", None) == 400 and "plugins_input" in text


def send_with_plugins_input(create: Any, body: Any, what: str) -> Any:
    """`create(body)` with `body.plugins_input` set; without it when the server refuses the field (see module)."""
    from kfp_server_api.exceptions import ApiException

    try:
        return create(body)
    except ApiException as err:
        if not is_plugins_input_refused(err):
            raise
        logger.warning("the KFP API does not take plugins_input (it is older than KFP 2.17, which has the MLflow "
                       "plugin that reads it): %s created without it, so KFP names no MLflow experiment", what)
        body.plugins_input = None
        return create(body)


def job_config(client: Any, package: Path, params: dict, pipeline_root: str | None) -> Any:
    """The package's spec and runtime config, as the client builds them for its own create calls."""
    return client._create_job_config(params=params, pipeline_package_path=str(package), pipeline_id=None,
                                     version_id=None, enable_caching=None, cache_key=None,
                                     pipeline_root=pipeline_root)


def create_run(client: Any, package: Path, *, experiment_id: str, display_name: str, params: dict,
               pipeline_root: str | None, service_account: str | None, plugins_input: dict) -> str:
    """Create a run of the compiled `package` with `plugins_input`; returns the run's id."""
    import kfp_server_api

    config = job_config(client, package, params, pipeline_root)
    body = kfp_server_api.V2beta1Run(experiment_id=experiment_id, display_name=display_name,
                                     pipeline_spec=config.pipeline_spec, runtime_config=config.runtime_config,
                                     service_account=service_account, plugins_input=plugins_input)
    run = send_with_plugins_input(lambda run: client._run_api.run_service_create_run(run=run), body,
                                  f"run {display_name!r}")
    return run.run_id


def create_recurring_run(client: Any, package: Path, *, experiment_id: str, display_name: str, cron: str,
                         params: dict, pipeline_root: str | None, service_account: str | None,
                         plugins_input: dict) -> str:
    """Create an enabled recurring run of `package` on `cron` (6 fields) with `plugins_input`; returns its id."""
    import kfp_server_api

    config = job_config(client, package, params, pipeline_root)
    trigger = kfp_server_api.V2beta1Trigger(cron_schedule=kfp_server_api.V2beta1CronSchedule(cron=cron))
    body = kfp_server_api.V2beta1RecurringRun(
        experiment_id=experiment_id, display_name=display_name, mode=kfp_server_api.RecurringRunMode.ENABLE,
        pipeline_spec=config.pipeline_spec, runtime_config=config.runtime_config, trigger=trigger,
        max_concurrency=MAX_CONCURRENCY, service_account=service_account, plugins_input=plugins_input)
    create = client._recurring_run_api.recurring_run_service_create_recurring_run
    recurring = send_with_plugins_input(lambda recurring_run: create(recurring_run=recurring_run), body,
                                        f"recurring run {display_name!r}")
    return recurring.recurring_run_id
