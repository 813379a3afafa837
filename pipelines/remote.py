"""Talking to a Kubeflow Pipelines API: submit a run, schedule a recurring run, upload a pipeline.

Packages are compiled here from the pipeline functions, so what is submitted is what `alignflow
compile` writes.

Authentication, first that applies:

- `KFP_TOKEN_PATH` (or the KFP SDK's `KF_PIPELINES_SA_TOKEN_PATH`): a file holding a bearer token,
  read again before every API call. A projected ServiceAccount token (audience
  `pipelines.kubeflow.org`, what multi-user Kubeflow accepts; the chart mounts one) is rotated by the
  kubelet, so a `submit --wait` that follows a run for hours always sends the current token.
- `KFP_TOKEN`: a fixed bearer token.
- otherwise the KFP client's own mechanisms (`KF_PIPELINES_*` variables, a kube context).

Nothing secret is passed on the command line. In multi-user Kubeflow every call names the profile
namespace (`namespace`, from `--namespace` or `KFP_NAMESPACE`): experiments, runs, recurring runs
and uploaded pipelines live there.

Following a run (`wait_for_run`) survives a flaky API: transient errors (connection failures,
timeouts, HTTP 408/429/500/502/503/504: the one definition, trainer/http/transient.py) are retried with
exponential backoff; anything else fails at once.
Creating a run is never retried (a retried create could start the run twice).
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainer.errors import PipelineError
from trainer.http.retry import RetryPolicy

logger = logging.getLogger(__name__)

SUCCEEDED = "SUCCEEDED"
FINISHED = ("SUCCEEDED", "FAILED", "SKIPPED", "CANCELED")
MAX_RETRIES = 7
MAX_BACKOFF_SECONDS = 60.0


class WaitTimeout(PipelineError):
    """The run was still going when `--timeout` ran out (it keeps running on the cluster)."""


class KfpUnavailable(PipelineError):
    """The KFP API kept failing past the retry budget while a run was followed."""


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where and as whom the CLI talks to KFP.

    Attributes:
        host: The KFP API endpoint.
        namespace: Kubeflow profile namespace (multi-user); None in single-user Kubeflow.
        ui_url: Base URL of the KFP UI for run links; empty uses `host`.
    """

    host: str
    namespace: str | None = None
    ui_url: str = ""

    def run_link(self, run_id: str) -> str:
        return f"{(self.ui_url or self.host).rstrip('/')}/#/runs/details/{run_id}"


def compile_package(name: str, directory: Path) -> Path:
    from kfp import compiler

    from pipelines.catalog import get_pipeline

    package = directory / f"{name}.yaml"
    compiler.Compiler().compile(get_pipeline(name), str(package))
    return package


def token_path(environ: dict[str, str] | None = None) -> str | None:
    """The bearer-token file named by KFP_TOKEN_PATH (else KF_PIPELINES_SA_TOKEN_PATH), if any."""
    environ = os.environ if environ is None else environ
    return environ.get("KFP_TOKEN_PATH") or environ.get("KF_PIPELINES_SA_TOKEN_PATH") or None


def read_token(path: str) -> str:
    """The token in `path`, stripped. Raises PipelineError naming the file when it cannot be read or is empty."""
    try:
        token = Path(path).read_text().strip()
    except OSError as err:
        raise PipelineError(f"KFP_TOKEN_PATH {path}: cannot read the KFP token ({err.strerror or err})") from err
    if not token:
        raise PipelineError(f"KFP_TOKEN_PATH {path}: the token file is empty")
    return token


def _token_file_credentials(path: str) -> Any:
    from kfp.client.token_credentials_base import TokenCredentialsBase

    class TokenFileCredentials(TokenCredentialsBase):
        """A bearer token read from `path` before each API call (the kubelet rotates projected tokens)."""

        def refresh_api_key_hook(self, config: Any) -> None:
            config.api_key["authorization"] = read_token(path)
            config.api_key_prefix["authorization"] = "Bearer"

    return TokenFileCredentials()


def make_client(endpoint: Endpoint) -> Any:
    """A KFP client for `endpoint`, authenticated as the module docstring says."""
    import kfp

    options: dict[str, Any] = {"host": endpoint.host}
    if endpoint.namespace:
        options["namespace"] = endpoint.namespace
    path = token_path()
    if path:
        read_token(path)  # a missing or empty file fails here, before anything is sent
        options["credentials"] = _token_file_credentials(path)
    elif os.environ.get("KFP_TOKEN"):
        options["existing_token"] = os.environ["KFP_TOKEN"]
    return kfp.Client(**options)


def cron_with_seconds(expression: str) -> str:
    """KFP's scheduler reads cron with a leading seconds field; accept the usual 5 fields too."""
    fields = expression.split()
    if len(fields) == 5:
        return "0 " + expression
    if len(fields) == 6:
        return expression
    raise PipelineError(f"--cron {expression!r}: expected 5 fields (minute hour day month weekday) or 6 with seconds")


@dataclass(frozen=True, slots=True)
class RunOptions:
    """How a run or a recurring run is started.

    Attributes:
        experiment: KFP experiment (created when missing), and the MLflow experiment KFP 2.17's MLflow plugin opens
            the run's MLflow runs in (`plugins_input.mlflow.experiment_name`: run_requests.py).
        service_account: Kubernetes ServiceAccount the run's pods use; empty: the namespace's default
            (in multi-user Kubeflow, the profile's `default-editor`).
        pipeline_root: Where the run's artifacts go (s3://, minio://); empty: the KFP default.
    """

    experiment: str = "alignflow"
    service_account: str = ""
    pipeline_root: str = ""


def start_run(name: str, endpoint: Endpoint, params: dict, options: RunOptions, run_name: str | None) -> str:
    """Create a run of pipeline `name` in `options.experiment` (KFP's and MLflow's); returns its id."""
    from pipelines.run_requests import create_run, mlflow_plugins_input

    client = make_client(endpoint)
    experiment_id = client.create_experiment(options.experiment, namespace=endpoint.namespace).experiment_id
    with tempfile.TemporaryDirectory() as scratch:
        package = compile_package(name, Path(scratch))
        return create_run(client, package, experiment_id=experiment_id,
                          display_name=run_name or f"{name} {time.strftime('%Y-%m-%d %H:%M')}", params=params,
                          pipeline_root=options.pipeline_root or None, service_account=options.service_account or None,
                          plugins_input=mlflow_plugins_input(options.experiment))


def wait_for_run(endpoint: Endpoint, run_id: str, timeout: float, poll_seconds: float = 10.0,
                 sleep: Callable[[float], None] = time.sleep) -> str:
    """Follow a run to its end and return its final state; transient API errors are retried.

    Raises:
        WaitTimeout: The run had not finished after `timeout` seconds.
        KfpUnavailable: The KFP API kept failing past the retry budget or the timeout.
    """
    client = make_client(endpoint)
    deadline = time.monotonic() + timeout
    retry = RetryPolicy(MAX_RETRIES, max(poll_seconds, 0.01), MAX_BACKOFF_SECONDS, sleep, deadline=deadline,
                        api="the KFP API", unavailable=KfpUnavailable)
    while True:
        run = retry.call(client.get_run, f"get_run {run_id}", run_id)
        state = str(run.state or "")
        if state in FINISHED:
            return state
        if time.monotonic() + poll_seconds > deadline:
            raise WaitTimeout(f"run {run_id} still {state or 'pending'} after {timeout:g} s "
                              f"(it goes on running: {endpoint.run_link(run_id)})")
        sleep(poll_seconds)


def _display_name_filter(name: str) -> str:
    return json.dumps({"predicates": [{"operation": "EQUALS", "key": "display_name", "stringValue": name}]})


def schedule(name: str, endpoint: Endpoint, params: dict, options: RunOptions, cron: str,
             job_name: str | None) -> tuple[str, list[str]]:
    """Create or replace the recurring run `job_name` (default `<pipeline>-retrain`) of the pipeline.

    KFP cannot change a recurring run in place: the new one is created first, then any earlier one of
    the same name in the experiment is deleted, so running this again (each `helm upgrade`) updates
    the schedule without leaving a duplicate, and a failed create leaves the old schedule in place. Each run it
    starts has its MLflow runs in MLflow experiment `options.experiment` too (run_requests.py).
    Returns (the new recurring run's id, the ids of those it replaced).
    """
    from pipelines.run_requests import create_recurring_run, mlflow_plugins_input

    client = make_client(endpoint)
    display_name = job_name or f"{name}-retrain"
    experiment_id = client.create_experiment(options.experiment, namespace=endpoint.namespace).experiment_id
    listed = client.list_recurring_runs(experiment_id=experiment_id, page_size=100,
                                        filter=_display_name_filter(display_name))
    earlier = [r.recurring_run_id for r in (listed.recurring_runs or []) if r.display_name == display_name]
    with tempfile.TemporaryDirectory() as scratch:
        package = compile_package(name, Path(scratch))
        recurring_id = create_recurring_run(
            client, package, experiment_id=experiment_id, display_name=display_name, cron=cron_with_seconds(cron),
            params=params, pipeline_root=options.pipeline_root or None,
            service_account=options.service_account or None, plugins_input=mlflow_plugins_input(options.experiment))
    for recurring_run_id in earlier:
        client.delete_recurring_run(recurring_run_id)
    return recurring_id, earlier


def upload(name: str, endpoint: Endpoint, pipeline_name: str | None, version: str | None) -> tuple[str, str]:
    """Upload the pipeline, or a new version of it when one of that name exists. Returns (pipeline, version) ids."""
    client = make_client(endpoint)
    display_name = pipeline_name or name
    with tempfile.TemporaryDirectory() as scratch:
        package = compile_package(name, Path(scratch))
        listed = client.list_pipelines(filter=_display_name_filter(display_name), namespace=endpoint.namespace)
        found = [p.pipeline_id for p in (listed.pipelines or []) if p.display_name == display_name]
        if not found:
            pipeline = client.upload_pipeline(str(package), pipeline_name=display_name, namespace=endpoint.namespace)
            return pipeline.pipeline_id, ""
        created = client.upload_pipeline_version(str(package), pipeline_version_name=version or time.strftime(
            "%Y%m%d-%H%M%S"), pipeline_id=found[0])
        return found[0], created.pipeline_version_id
