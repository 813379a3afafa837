"""S3 storage through boto3, for AWS and any S3-compatible store (MinIO, Ceph, ...).

Endpoint, region and credentials come from the standard AWS chain (`AWS_ENDPOINT_URL` or
`AWS_ENDPOINT_URL_S3`, `AWS_DEFAULT_REGION`, `AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY`,
`~/.aws/config`, instance roles); nothing secret is passed in or logged. Files above
`ALIGNFLOW_S3_MULTIPART_MB` (default 64) go up in parts, `ALIGNFLOW_S3_CONCURRENCY` (default 8)
at a time.

Outages: every call (reads, writes, transfers, `exists`, `list`, deletes) is retried with
exponential backoff (0.5 s doubling up to 30 s) until `ALIGNFLOW_S3_RETRY_SECONDS` (default 300)
have passed since its first attempt; only answers that retrying cannot change (no such bucket or
key, access denied, a failed condition) end it at once. The error then names the endpoint, the
URI, the operation and the last failure in one line.
"""

from __future__ import annotations

import logging
import os
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
PERMANENT = ("NoSuchBucket", "403", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidBucketName")
CONDITION = ("412", "PreconditionFailed", "ConditionalRequestConflict")


def split_uri(uri: str) -> tuple[str, str]:
    """`s3://bucket/key` (or KFP's `minio://bucket/key`) -> (bucket, key)."""
    scheme, sep, rest = uri.partition("://")
    bucket, _, key = rest.partition("/")
    if not sep or scheme not in ("s3", "minio") or not bucket:
        raise StorageError(f"{uri}: expected s3://bucket/key or minio://bucket/key")
    return bucket, key


def error_code(err: Exception) -> str:
    response = getattr(err, "response", None) or {}
    return str(response.get("Error", {}).get("Code", ""))


def first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


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
        self.retry_seconds = retry_seconds if retry_seconds is not None else float(
            os.environ.get("ALIGNFLOW_S3_RETRY_SECONDS", DEFAULT_RETRY_SECONDS))
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
        """Run `function`, retrying transient failures with backoff until `retry_seconds` have passed."""
        from boto3.exceptions import S3UploadFailedError
        from botocore.exceptions import BotoCoreError, ClientError

        started = time.monotonic()
        delay, attempt = 0.5, 0
        while True:
            attempt += 1
            try:
                return function()
            except ClientError as err:
                code = error_code(err)
                if code in CONDITION:
                    raise ConditionFailed(f"{uri}: {action}: the object changed (precondition failed)") from err
                if code == "NoSuchBucket":
                    raise StorageError(f"{uri}: cannot {action}: bucket {split_uri(uri)[0]!r} does not exist at "
                                       f"{self.endpoint}") from err
                if code in MISSING or code in PERMANENT:
                    raise StorageError(f"{uri}: cannot {action}: {code} at {self.endpoint}") from err
                last = err
            except (BotoCoreError, S3UploadFailedError, OSError) as err:
                if isinstance(err, S3UploadFailedError) and "NoSuchBucket" in str(err):
                    raise StorageError(f"{uri}: cannot {action}: bucket {split_uri(uri)[0]!r} does not exist at "
                                       f"{self.endpoint}") from err
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
