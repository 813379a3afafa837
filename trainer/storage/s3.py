"""S3 storage through boto3, for AWS and any S3-compatible store (MinIO, Ceph, ...).

Endpoint, region and credentials come from the standard AWS chain (`AWS_ENDPOINT_URL` or
`AWS_ENDPOINT_URL_S3`, `AWS_DEFAULT_REGION`, `AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY`,
`~/.aws/config`, instance roles); nothing secret is passed in or logged. Files above
`ALIGNFLOW_S3_MULTIPART_MB` (default 64) go up in parts, `ALIGNFLOW_S3_CONCURRENCY` (default 8)
at a time.

Outages: every call (reads, writes, transfers, `exists`, `list`, deletes) that fails transiently
(endpoint unreachable, connection reset, timeouts, 5xx, throttling, RequestTimeout) is retried with
exponential backoff (0.5 s doubling up to 30 s) until `ALIGNFLOW_S3_RETRY_SECONDS` (default 300;
the chart's `s3.retrySeconds`) have passed since its first attempt. Every other failure (no such
bucket or key, access denied, bad keys, a malformed parameter, missing credentials, a local file
that cannot be read) ends it at once (`classify`). Either way the error names the URI, the
operation, the endpoint and the failure in one line.
"""

from __future__ import annotations

import builtins
import logging
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainer.errors import StorageError
from trainer.storage.base import ConditionFailed

logger = logging.getLogger(__name__)

MB = 1024 * 1024
DEFAULT_RETRY_SECONDS = 300.0
MAX_BACKOFF_SECONDS = 30.0
MISSING = ("404", "NoSuchKey", "NotFound")
CONDITION = ("412", "PreconditionFailed", "ConditionalRequestConflict")
# Answers an overloaded or briefly unavailable store gives; retrying may change them.
TRANSIENT = ("500", "502", "503", "504", "429", "InternalError", "ServiceUnavailable", "SlowDown", "Throttling",
             "ThrottlingException", "TooManyRequests", "RequestLimitExceeded", "RequestTimeout",
             "RequestTimeoutException", "BadGateway", "GatewayTimeout")


def split_uri(uri: str) -> tuple[str, str]:
    """`s3://bucket/key` (or KFP's `minio://bucket/key`) -> (bucket, key)."""
    scheme, sep, rest = uri.partition("://")
    bucket, _, key = rest.partition("/")
    if not sep or scheme not in ("s3", "minio") or not bucket:
        raise StorageError(f"{uri}: expected s3://bucket/key or minio://bucket/key")
    return bucket, key


def retry_seconds_from_environment() -> float:
    """`ALIGNFLOW_S3_RETRY_SECONDS`; unset or empty (a blank ConfigMap key) means the default."""
    text = os.environ.get("ALIGNFLOW_S3_RETRY_SECONDS", "").strip()
    if not text:
        return DEFAULT_RETRY_SECONDS
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not seconds >= 0:
        raise StorageError(f"ALIGNFLOW_S3_RETRY_SECONDS is {text!r}, expected a number of seconds >= 0")
    return seconds


def error_code(err: Exception) -> str:
    response = getattr(err, "response", None) or {}
    return str(response.get("Error", {}).get("Code", ""))


def first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


def _status(err: Exception) -> int:
    response = getattr(err, "response", None) or {}
    return int(response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)


def classify(err: Exception) -> str:
    """What a failed call means: `transient` (retry), `condition`, `no-bucket`, `permanent` (fail at once), or
    `foreign` (not an S3 or network error: re-raised as it is).

    Only what an outage or an overloaded store produces is transient: connection errors and timeouts,
    5xx, throttling (429, SlowDown, Throttling) and RequestTimeout. Everything else S3 or botocore
    answers (no such bucket, access denied, bad keys, a malformed request or parameter, missing
    credentials) would give the same answer on every retry.
    """
    from boto3.exceptions import S3UploadFailedError
    from botocore.exceptions import (
        BotoCoreError,
        ClientError,
        ConnectionError,
        HTTPClientError,
        IncompleteReadError,
        ResponseStreamingError,
    )

    if isinstance(err, ClientError):
        code = error_code(err)
        if code in CONDITION:
            return "condition"
        if code == "NoSuchBucket":
            return "no-bucket"
        return "transient" if code in TRANSIENT or _status(err) >= 500 or _status(err) == 429 else "permanent"
    if isinstance(err, S3UploadFailedError):  # a transfer's ClientError, flattened into its message
        found = re.search(r"An error occurred \((\w+)\)", str(err))
        code = found.group(1) if found else ""
        if code == "NoSuchBucket":
            return "no-bucket"
        return "permanent" if code and code not in TRANSIENT and not code.isdigit() else "transient"
    if isinstance(err, (ConnectionError, HTTPClientError, IncompleteReadError, ResponseStreamingError)):
        return "transient"  # endpoint unreachable, connect/read timeouts, a connection dropped mid-answer
    if isinstance(err, BotoCoreError):
        return "permanent"  # ParamValidationError, NoCredentialsError, NoRegionError, ...
    if isinstance(err, (builtins.ConnectionError, TimeoutError)):
        return "transient"
    if isinstance(err, OSError):
        return "permanent"  # a local file that cannot be read or written
    return "foreign"


class S3Storage:
    """S3 objects by URI. One client per process (`shared`), created lazily.

    Args:
        multipart_threshold: Bytes above which uploads go in parts (default from the environment).
        max_concurrency: Parts in flight per transfer (default from the environment).
        retry_seconds: How long one call keeps retrying (default `ALIGNFLOW_S3_RETRY_SECONDS` or 300).
    """

    _shared: S3Storage | None = None

    def __init__(self, multipart_threshold: int | None = None, max_concurrency: int | None = None,
                 retry_seconds: float | None = None) -> None:
        import boto3
        from boto3.s3.transfer import TransferConfig
        from botocore.config import Config

        threshold = multipart_threshold or int(os.environ.get("ALIGNFLOW_S3_MULTIPART_MB", 64)) * MB
        concurrency = max_concurrency or int(os.environ.get("ALIGNFLOW_S3_CONCURRENCY", 8))
        self.retry_seconds = retry_seconds if retry_seconds is not None else retry_seconds_from_environment()
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        # botocore retries a little on its own (fast); the deadline loop below rides out longer outages.
        self.client = boto3.client("s3", endpoint_url=endpoint, config=Config(
            retries={"mode": "standard", "max_attempts": 2}, connect_timeout=10, read_timeout=60))
        self.transfer = TransferConfig(multipart_threshold=threshold, multipart_chunksize=max(threshold, 5 * MB),
                                       max_concurrency=concurrency)

    @classmethod
    def shared(cls) -> S3Storage:
        if cls._shared is None:
            cls._shared = cls()
        return cls._shared

    @property
    def endpoint(self) -> str:
        return self.client.meta.endpoint_url

    def _call(self, uri: str, action: str, function: Callable[[], Any]) -> Any:
        """Run `function`, retrying transient failures with backoff until `retry_seconds` have passed.

        Anything else (see `classify`) fails at once with one line naming the URI and the endpoint.
        """
        started = time.monotonic()
        delay, attempt = 0.5, 0
        while True:
            attempt += 1
            try:
                return function()
            except Exception as err:  # classified below; what is not S3's or the network's is re-raised
                kind = classify(err)
                if kind == "foreign":
                    raise
                if kind == "condition":
                    raise ConditionFailed(f"{uri}: {action}: the object changed (precondition failed)") from err
                if kind == "no-bucket":
                    raise StorageError(f"{uri}: cannot {action}: bucket {split_uri(uri)[0]!r} does not exist at "
                                       f"{self.endpoint}") from err
                if kind == "permanent":
                    raise StorageError(f"{uri}: cannot {action} at S3 endpoint {self.endpoint}: {first_line(err)} "
                                       "(not retried: retrying cannot change this answer)") from err
                last = err
            elapsed = time.monotonic() - started
            if elapsed + delay > self.retry_seconds:
                raise StorageError(f"{uri}: cannot {action} at S3 endpoint {self.endpoint}: {first_line(last)} "
                                   f"(retried {attempt} times over {elapsed:.0f} s; ALIGNFLOW_S3_RETRY_SECONDS is "
                                   f"{self.retry_seconds:g})") from last
            log = logger.warning if attempt == 1 else logger.info
            log("%s: %s failed (%s); retrying for up to %.0f s more", uri, action, first_line(last),
                self.retry_seconds - elapsed)
            time.sleep(delay)
            delay = min(delay * 2, MAX_BACKOFF_SECONDS)

    def exists(self, uri: str) -> bool:
        from botocore.exceptions import ClientError

        bucket, key = split_uri(uri)

        def head() -> bool:
            try:
                self.client.head_object(Bucket=bucket, Key=key)
                return True
            except ClientError as err:
                if error_code(err) in MISSING:
                    return False
                raise

        return self._call(uri, "check", head)

    def read_bytes(self, uri: str) -> bytes:
        bucket, key = split_uri(uri)
        return self._call(uri, "read", lambda: self.client.get_object(Bucket=bucket, Key=key)["Body"].read())

    def write_bytes(self, uri: str, data: bytes) -> None:
        bucket, key = split_uri(uri)
        self._call(uri, "write", lambda: self.client.put_object(Bucket=bucket, Key=key, Body=data))

    def create_exclusive(self, uri: str, data: bytes) -> str | None:
        """Write `uri` only if no object is there (`If-None-Match: *`); its ETag, or None if one was."""
        bucket, key = split_uri(uri)
        try:
            response = self._call(uri, "create", lambda: self.client.put_object(
                Bucket=bucket, Key=key, Body=data, IfNoneMatch="*"))
        except ConditionFailed:
            return None
        return response["ETag"].strip('"')

    def replace_if_unchanged(self, uri: str, data: bytes, etag: str) -> str | None:
        """Overwrite `uri` only if its ETag is still `etag` (`If-Match`); the new ETag, or None if it changed."""
        bucket, key = split_uri(uri)
        try:
            response = self._call(uri, "replace", lambda: self.client.put_object(
                Bucket=bucket, Key=key, Body=data, IfMatch=f'"{etag}"'))
        except ConditionFailed:
            return None
        return response["ETag"].strip('"')

    def upload_file(self, local: Path, uri: str) -> None:
        bucket, key = split_uri(uri)
        self._call(uri, "upload", lambda: self.client.upload_file(str(local), bucket, key, Config=self.transfer))

    def download_file(self, uri: str, local: Path) -> None:
        bucket, key = split_uri(uri)
        local.parent.mkdir(parents=True, exist_ok=True)
        temporary = local.with_name(f".{local.name}.part")
        self._call(uri, "download", lambda: self.client.download_file(bucket, key, str(temporary), Config=self.transfer))
        os.replace(temporary, local)

    def list(self, prefix: str) -> list[str]:
        bucket, key = split_uri(prefix)
        key = key.rstrip("/") + "/" if key else ""
        scheme = prefix.partition("://")[0]

        def list_all() -> list[str]:
            uris = []
            for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=key):
                # Answers keep the caller's scheme (s3:// or minio://).
                uris.extend(f"{scheme}://{bucket}/{item['Key']}" for item in page.get("Contents", []))
            return sorted(uris)

        return self._call(prefix, "list", list_all)

    def delete(self, uri: str) -> None:
        bucket, key = split_uri(uri)
        self._call(uri, "delete", lambda: self.client.delete_object(Bucket=bucket, Key=key))

    def etag(self, uri: str) -> str:
        bucket, key = split_uri(uri)
        return self._call(uri, "stat", lambda: self.client.head_object(Bucket=bucket, Key=key)["ETag"].strip('"'))

    def size(self, uri: str) -> int:
        bucket, key = split_uri(uri)
        return self._call(uri, "stat", lambda: self.client.head_object(Bucket=bucket, Key=key)["ContentLength"])
