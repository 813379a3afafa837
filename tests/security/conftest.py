"""Services for the security tests: a real MLflow server on loopback (sqlite, local artifacts)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.services import start_mlflow, stop


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory) -> tuple[str, Path]:
    """`mlflow server` with one worker; returns its URI and the folder where it keeps artifacts."""
    root = tmp_path_factory.mktemp("mlflow-security")
    artifacts = root / "artifacts"
    process, uri = start_mlflow(root, str(artifacts), {})
    yield uri, artifacts
    stop(process)
