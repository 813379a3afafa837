"""Browser links to MLflow: `ALIGNFLOW_MLFLOW_EXTERNAL_URL` (the chart's `mlflow.externalUrl`) when set,
else the tracking URI when it is an http(s) server; none for a local sqlite or file store.

The in-cluster tracking URI (http://af-mlflow.ml:5000) does not open in a browser; the external URL
(an Ingress or gateway) does, which is why it wins.
"""

from __future__ import annotations

import os
import urllib.parse

from trainer.redact import redact_uri


def mlflow_base_url(tracking_uri: str = "", environ: dict[str, str] | None = None) -> str:
    """The base URL of MLflow's UI, without credentials, or "" when there is none to link to."""
    environ = os.environ if environ is None else environ
    base = environ.get("ALIGNFLOW_MLFLOW_EXTERNAL_URL") or ""
    if not base and tracking_uri.startswith(("http://", "https://")):
        base = tracking_uri
    return redact_uri(base).rstrip("/") if base else ""


def run_link(experiment_id: str, run_id: str, tracking_uri: str = "", environ: dict[str, str] | None = None) -> str:
    base = mlflow_base_url(tracking_uri, environ)
    return f"{base}/#/experiments/{experiment_id}/runs/{run_id}" if base and experiment_id and run_id else ""


def model_version_link(name: str, version: str, tracking_uri: str = "", environ: dict[str, str] | None = None) -> str:
    base = mlflow_base_url(tracking_uri, environ)
    return f"{base}/#/models/{urllib.parse.quote(name)}/versions/{version}" if base else ""


def stage_run_link(location: dict, environ: dict[str, str] | None = None) -> str:
    """The link for a stage's `mlflow_run.json` (written by the trainer's tracker)."""
    return run_link(location.get("experiment_id", ""), location.get("run_id", ""), location.get("tracking_uri", ""),
                    environ) or location.get("link", "")
