"""Planted credentials never show up in logs, run files, MLflow params or tags (issue 11, item 3).

An SFT run tracks to a real MLflow server with every credential a pod may hold set in its
environment: S3 keys, MLflow's password and token, and a user:password inside MLFLOW_TRACKING_URI.
Then everything the run left is scanned: each log record (any level, any library), whatever
reached the process's stdout/stderr, every file under the output directory and in the server's
artifact store, every param, tag and metric key of the MLflow run, and the KFP reports (Markdown
and HTML) a stage component publishes from that output. Before, the URI's password
was in the "tracking to MLflow run" line and in `mlflow_run.json`, which the stage report links.
"""

from __future__ import annotations

import json
import logging
import secrets
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.conftest import make_config
from trainer.supervised.stages import run_stage


@pytest.fixture
def planted(monkeypatch, mlflow_server) -> dict[str, str]:
    """Credentials in the environment, each a unique random string; returns them by variable."""
    uri, _ = mlflow_server
    values = {
        "AWS_ACCESS_KEY_ID": "AKIA" + secrets.token_hex(8).upper(),
        "AWS_SECRET_ACCESS_KEY": secrets.token_urlsafe(30),
        "AWS_SESSION_TOKEN": secrets.token_urlsafe(40),
        "MLFLOW_TRACKING_PASSWORD": "pw-" + secrets.token_urlsafe(16),
        "MLFLOW_TRACKING_TOKEN": "tok-" + secrets.token_urlsafe(24),
        "uri_password": "uri-pw-" + secrets.token_urlsafe(16),
    }
    for name, value in values.items():
        if name.isupper():
            monkeypatch.setenv(name, value)
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "alignflow-bot")
    host = urlsplit(uri).netloc
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://alignflow-bot:{values['uri_password']}@{host}")
    return values


def leaks(text: str, planted: dict[str, str]) -> list[str]:
    return [name for name, value in planted.items() if value in text]


def test_planted_secrets_appear_in_no_log_file_param_or_tag(planted, mlflow_server, tmp_path, tiny_model, task_files,
                                                             caplog, capfd):
    uri, artifacts = mlflow_server
    config = make_config("sft", tmp_path / "out", tiny_model, task_files["sft_train"], task_files["sft_eval"],
                         train={"max_steps": 3, "log_interval": 1},
                         tracking={"backend": "mlflow", "experiment_name": "security", "pipeline_run_id": "p-1"})
    with caplog.at_level(logging.DEBUG):
        run_stage(config)

    found: dict[str, list[str]] = {}
    for record in caplog.records:
        text = record.getMessage() + (record.exc_text or "")
        if hits := leaks(text, planted):
            found[f"log {record.name}:{record.lineno}"] = hits
    captured = capfd.readouterr()
    if hits := leaks(captured.out + captured.err, planted):
        found["stdout/stderr"] = hits
    files = [p for root in (tmp_path / "out", artifacts) for p in root.rglob("*") if p.is_file()]
    assert any(p.name == "mlflow_run.json" for p in files) and any(p.name == "model.safetensors" for p in files)
    for path in files:
        if hits := leaks(path.read_bytes().decode("latin-1"), planted):
            found[str(path)] = hits

    from mlflow import MlflowClient

    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("security")
    (run,) = client.search_runs([experiment.experiment_id], "tags.`alignflow.pipeline_run_id` = 'p-1'")
    assert run.data.params["optimizer.lr"] and run.data.metrics  # the run really was tracked
    for kind, entries in (("param", run.data.params), ("tag", run.data.tags), ("metric", run.data.metrics)):
        for key, value in entries.items():
            if hits := leaks(f"{key}={value}", planted):
                found[f"MLflow {kind} {key}"] = hits
    # The KFP reports a stage component publishes from the same output (Markdown and HTML plot).
    from components.reports.curves import stage_html
    from components.reports.stage import stage_report

    final = json.loads((tmp_path / "out" / "final_metrics.json").read_text())
    for name, report in (("Markdown report", stage_report("sft", {}, final, str(tmp_path / "out"))),
                         ("HTML curves", stage_html("sft", final, str(tmp_path / "out")))):
        assert "MLflow" in report or name == "HTML curves"  # the report does link the run
        if hits := leaks(report, planted):
            found[f"KFP {name}"] = hits
    assert not found, found

    # What is published still points at the run, minus the credentials.
    location = json.loads((tmp_path / "out" / "mlflow_run.json").read_text())
    assert location["tracking_uri"] == uri and location["run_id"] == run.info.run_id
    assert location["link"].startswith(f"{uri}/#/experiments/")
    assert any(f"tracking to MLflow run {run.info.run_id} at {uri}" in r.getMessage() for r in caplog.records)


def test_config_values_with_user_info_are_redacted_in_params(tmp_path):
    from trainer.tracking.tracker import JsonlTracker

    tracker = JsonlTracker(Path(tmp_path))
    tracker.log_params({"model": {"path": "https://user:hunter22@hub/m"}, "tracking": {"api_key": "hunter22"}})
    tracker.close()
    params = (tmp_path / "params.json").read_text()
    assert "hunter22" not in params and "https://hub/m" in params


def test_warning_when_the_tracking_server_is_down_has_no_credentials(tmp_path, monkeypatch, caplog):
    from tests.integration.services import free_port
    from trainer.config import TrackingConfig
    from trainer.tracking.tracker import build_tracker

    password = "pw-" + secrets.token_urlsafe(16)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://bot:{password}@127.0.0.1:{free_port()}")  # nothing listens
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    with caplog.at_level(logging.WARNING):
        build_tracker(tmp_path, True, TrackingConfig(backend="mlflow"), "sft").close()
    (warning,) = [r.getMessage() for r in caplog.records if "MLflow tracking disabled" in r.getMessage()]
    assert "127.0.0.1" in warning and password not in warning and "bot:" not in warning
