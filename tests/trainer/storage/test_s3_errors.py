"""S3 errors that cannot heal fail at once, naming the URI, the endpoint and the error in one line; transient ones
(an unreachable endpoint, 503 SlowDown) are retried to the deadline. Against a real moto server on loopback."""

from __future__ import annotations

import http.server
import threading
import time
import uuid

import pytest

from tests.integration.services import S3_ENV, free_port, start_moto, stop
from trainer.errors import StorageError
from trainer.storage.s3 import S3Storage, retry_seconds_from_environment


@pytest.fixture(scope="module")
def moto(tmp_path_factory):
    process, endpoint = start_moto(tmp_path_factory.mktemp("moto"))
    yield endpoint
    stop(process)


@pytest.fixture
def storage(moto, monkeypatch) -> S3Storage:
    """A client on moto with the default 300 s budget: a test that waits for it would show."""
    for name, value in {**S3_ENV, "AWS_ENDPOINT_URL": moto}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("ALIGNFLOW_S3_RETRY_SECONDS", raising=False)
    return S3Storage()


@pytest.fixture
def bucket(storage) -> str:
    name = f"test-{uuid.uuid4().hex[:12]}"
    storage.client.create_bucket(Bucket=name)
    return name


def timed_error(call) -> tuple[str, float]:
    started = time.monotonic()
    with pytest.raises(StorageError) as raised:
        call()
    return str(raised.value), time.monotonic() - started


@pytest.mark.parametrize("operation", ["read", "write", "list", "upload"])
def test_a_missing_bucket_fails_at_once_naming_the_bucket(operation, storage, moto, tmp_path):
    local = tmp_path / "f.bin"
    local.write_bytes(b"x")
    uri = "s3://no-such-bucket-af/runs/a.bin"
    call = {"read": lambda: storage.read_bytes(uri), "write": lambda: storage.write_bytes(uri, b"x"),
            "list": lambda: storage.list("s3://no-such-bucket-af/runs"),
            "upload": lambda: storage.upload_file(local, uri)}[operation]
    message, seconds = timed_error(call)
    assert seconds < 5
    assert "'no-such-bucket-af' does not exist" in message and moto in message and "\n" not in message


def test_a_missing_key_fails_at_once(storage, bucket, moto):
    message, seconds = timed_error(lambda: storage.read_bytes(f"s3://{bucket}/missing.json"))
    assert seconds < 5
    assert message.startswith(f"s3://{bucket}/missing.json: cannot read at S3 endpoint {moto}: ")
    assert "NoSuchKey" in message and "not retried" in message


def test_a_malformed_parameter_fails_at_once(storage):
    # botocore refuses the bucket name before sending anything (ParamValidationError): no retry can fix it.
    message, seconds = timed_error(lambda: storage.read_bytes("s3://Bad_Bucket!/k"))
    assert seconds < 5 and "Bad_Bucket!" in message and "not retried" in message


def test_a_local_file_that_cannot_be_read_fails_at_once(storage, bucket, tmp_path):
    message, seconds = timed_error(lambda: storage.upload_file(tmp_path / "absent.bin", f"s3://{bucket}/a.bin"))
    assert seconds < 5 and "absent.bin" in message


def test_an_unreachable_endpoint_is_retried_to_the_deadline_and_named(monkeypatch):
    unreachable = f"http://127.0.0.1:{free_port()}"
    for name, value in {**S3_ENV, "AWS_ENDPOINT_URL": unreachable, "ALIGNFLOW_S3_RETRY_SECONDS": "2"}.items():
        monkeypatch.setenv(name, value)
    storage = S3Storage()
    assert storage.retry_seconds == 2
    message, seconds = timed_error(lambda: storage.read_bytes("s3://b/k"))
    assert 1 < seconds < 10
    assert message.startswith(f"s3://b/k: cannot read at S3 endpoint {unreachable}: ")
    assert "ALIGNFLOW_S3_RETRY_SECONDS is 2" in message


class SlowDownThenOk(http.server.BaseHTTPRequestHandler):
    """An S3 endpoint that is overloaded for its first three requests (503 SlowDown), then answers HEAD."""

    count = 0

    def do_HEAD(self):  # noqa: N802 (the name http.server calls)
        type(self).count += 1
        if type(self).count <= 3:
            self.send_response(503)
            self.send_header("Content-Length", "0")
        else:
            self.send_response(200)
            self.send_header("ETag", '"abc"')
            self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def test_throttling_is_retried_until_the_store_answers(monkeypatch):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), SlowDownThenOk)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        for name, value in {**S3_ENV, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{server.server_port}"}.items():
            monkeypatch.setenv(name, value)
        assert S3Storage(retry_seconds=30).exists("s3://b/k") is True
        assert SlowDownThenOk.count == 4  # three 503s (botocore's own retry and ours), then the answer
    finally:
        server.shutdown()


@pytest.mark.parametrize(("value", "expected"), [("", 300.0), ("  ", 300.0), ("12.5", 12.5), ("0", 0.0)])
def test_retry_budget_from_the_environment(value, expected, monkeypatch):
    monkeypatch.setenv("ALIGNFLOW_S3_RETRY_SECONDS", value)
    assert retry_seconds_from_environment() == expected


@pytest.mark.parametrize("value", ["5m", "-1", "nan"])
def test_a_bad_retry_budget_is_one_error_naming_the_variable(value, monkeypatch):
    monkeypatch.setenv("ALIGNFLOW_S3_RETRY_SECONDS", value)
    with pytest.raises(StorageError, match=f"ALIGNFLOW_S3_RETRY_SECONDS is '{value}', expected"):
        retry_seconds_from_environment()
