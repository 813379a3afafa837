"""Session services for the integration tests: moto S3 and an MLflow server whose artifacts go to it."""

from __future__ import annotations

import os
import uuid

import pytest

from tests.integration.services import S3_ENV, start_mlflow, start_moto, stop


@pytest.fixture(scope="session")
def s3_endpoint(tmp_path_factory):
    """A moto S3 server; the AWS environment points at it for the whole session."""
    from trainer.storage.s3 import S3Storage

    process, endpoint = start_moto(tmp_path_factory.mktemp("moto"))
    saved = {key: os.environ.get(key) for key in [*S3_ENV, "AWS_ENDPOINT_URL"]}
    os.environ.update(S3_ENV, AWS_ENDPOINT_URL=endpoint)
    S3Storage._shared = None  # a client made before this fixture would point elsewhere
    yield endpoint
    S3Storage._shared = None
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    stop(process)


@pytest.fixture
def s3_env(s3_endpoint, monkeypatch) -> str:
    """The AWS environment on the session's moto server, set again for this test: under `-n 2` a test elsewhere in
    this worker may have created the session fixture while its own monkeypatched server was in the environment,
    and then put that back. A fixture that points the environment elsewhere (a fault proxy) asks for this first."""
    for key, value in {**S3_ENV, "AWS_ENDPOINT_URL": s3_endpoint}.items():
        monkeypatch.setenv(key, value)
    return s3_endpoint


@pytest.fixture
def bucket(s3_env) -> str:
    """A fresh bucket on the session's moto server."""
    import boto3

    name = f"test-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=s3_env).create_bucket(Bucket=name)
    return name


@pytest.fixture(scope="session")
def mlflow_server(s3_endpoint, tmp_path_factory):
    """A real `mlflow server` (sqlite backend, artifacts proxied to a moto bucket, one worker)."""
    import boto3

    boto3.client("s3", endpoint_url=s3_endpoint).create_bucket(Bucket="mlflow-artifacts")
    env = {**S3_ENV, "MLFLOW_S3_ENDPOINT_URL": s3_endpoint, "AWS_ENDPOINT_URL": s3_endpoint}
    process, uri = start_mlflow(tmp_path_factory.mktemp("mlflow"), "s3://mlflow-artifacts/runs", env)
    yield uri
    stop(process)
