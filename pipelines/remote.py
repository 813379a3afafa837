"""Talking to a Kubeflow Pipelines API: submit a run, schedule a recurring run, upload a pipeline.

Packages are compiled here from the pipeline functions, so what is submitted is what `alignflow
compile` writes. Authentication uses the KFP client's own mechanisms (`KF_PIPELINES_*` variables,
the in-cluster service account token, a kube context) or a bearer token in `KFP_TOKEN`; nothing
secret is passed on the command line.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from trainer.errors import PipelineError

SUCCEEDED = "SUCCEEDED"
FINISHED = ("SUCCEEDED", "FAILED", "SKIPPED", "CANCELED")


def compile_package(name: str, directory: Path) -> Path:
    from kfp import compiler

    from pipelines.catalog import get_pipeline

    package = directory / f"{name}.yaml"
    compiler.Compiler().compile(get_pipeline(name), str(package))
    return package


def make_client(host: str) -> Any:
    """A KFP client; a bearer token, when the endpoint needs one, comes from KFP_TOKEN."""
    import os

    import kfp

    return kfp.Client(host=host, existing_token=os.environ.get("KFP_TOKEN") or None)


def cron_with_seconds(expression: str) -> str:
    """KFP's scheduler reads cron with a leading seconds field; accept the usual 5 fields too."""
    fields = expression.split()
    if len(fields) == 5:
        return "0 " + expression
    if len(fields) == 6:
        return expression
    raise PipelineError(f"--cron {expression!r}: expected 5 fields (minute hour day month weekday) or 6 with seconds")


def submit(name: str, host: str, params: dict, experiment: str, run_name: str | None, wait: bool,
           timeout: float, poll_seconds: float = 10.0) -> tuple[str, str]:
    """Start a run; with `wait`, follow it to the end. Returns (run id, final state or 'submitted')."""
    client = make_client(host)
    with tempfile.TemporaryDirectory() as scratch:
        package = compile_package(name, Path(scratch))
        run = client.create_run_from_pipeline_package(str(package), arguments=params, experiment_name=experiment,
                                                      run_name=run_name or f"{name} {time.strftime('%Y-%m-%d %H:%M')}")
    if not wait:
        return run.run_id, "submitted"
    deadline = time.monotonic() + timeout
    while True:
        state = str(client.get_run(run.run_id).state or "")
        if state in FINISHED:
            return run.run_id, state
        if time.monotonic() > deadline:
            raise PipelineError(f"run {run.run_id} still {state or 'pending'} after {timeout:g} s")
        time.sleep(poll_seconds)


def schedule(name: str, host: str, params: dict, experiment: str, cron: str, job_name: str | None) -> str:
    """Create a recurring run of the pipeline; returns its id."""
    client = make_client(host)
    experiment_id = client.create_experiment(experiment).experiment_id
    with tempfile.TemporaryDirectory() as scratch:
        package = compile_package(name, Path(scratch))
        recurring = client.create_recurring_run(experiment_id, job_name or f"{name}-retrain",
                                                cron_expression=cron_with_seconds(cron),
                                                pipeline_package_path=str(package), params=params)
    return recurring.recurring_run_id


def upload(name: str, host: str, pipeline_name: str | None, version: str | None) -> tuple[str, str]:
    """Upload the pipeline, or a new version of it when one of that name exists. Returns (pipeline, version) ids."""
    client = make_client(host)
    display_name = pipeline_name or name
    with tempfile.TemporaryDirectory() as scratch:
        package = compile_package(name, Path(scratch))
        pipeline_id = client.get_pipeline_id(display_name)
        if pipeline_id is None:
            pipeline = client.upload_pipeline(str(package), pipeline_name=display_name)
            return pipeline.pipeline_id, ""
        created = client.upload_pipeline_version(str(package), pipeline_version_name=version or time.strftime(
            "%Y%m%d-%H%M%S"), pipeline_id=pipeline_id)
        return pipeline_id, created.pipeline_version_id
