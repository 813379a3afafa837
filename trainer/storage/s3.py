"""S3 storage through boto3, for AWS and any S3-compatible store (MinIO, Ceph, ...).

Endpoint, region and credentials come from the standard AWS chain (`AWS_ENDPOINT_URL` or
`AWS_ENDPOINT_URL_S3`, `AWS_DEFAULT_REGION`, `AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY`,
`~/.aws/config`, instance roles); nothing secret is passed in or logged. API calls use botocore's
standard retry mode; whole-file transfers are also retried with exponential backoff. Files above
`ALIGNFLOW_S3_MULTIPART_MB` (default 64) go up in parts, `ALIGNFLOW_S3_CONCURRENCY` (default 8)
at a time.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainer.errors import StorageError

logger = logging.getLogger(__name__)

MB = 1024 * 1024


def split_uri(uri: str) -> tuple[str, str]:
    """`s3://bucket/key` (or `minio://bucket/key`) -> (bucket, key)."""
    scheme, sep, rest = uri.partition("://")
    bucket, _, key = rest.partition("/")
    if not sep or scheme not in ("s3", "minio") or not bucket:
        raise StorageError(f"{uri}: expected s3://bucket/key or minio://bucket/key")
    return bucket, key


class S3Storage:
    """S3 objects by URI. One client per process (`shared`), created lazily."""

    _shared: S3Storage | None = None

    def __init__(self, multipart_threshold: int | None = None, max_concurrency: int | None = None,
                 max_attempts: int = 5) -> None:
        import boto3
        from boto3.s3.transfer import TransferConfig
        from botocore.config import Config

        threshold = multipart_threshold or int(os.environ.get("ALIGNFLOW_S3_MULTIPART_MB", 64)) * MB
        concurrency = max_concurrency or int(os.environ.get("ALIGNFLOW_S3_CONCURRENCY", 8))
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        self.client = boto3.client("s3", endpoint_url=endpoint,
                                   config=Config(retries={"mode": "standard", "max_attempts": max_attempts}))
        self.transfer = TransferConfig(multipart_threshold=threshold, multipart_chunksize=max(threshold, 5 * MB),
                                       max_concurrency=concurrency)
        self.max_attempts = max_attempts

    @classmethod
    def shared(cls) -> S3Storage:
        if cls._shared is None:
            cls._shared = cls()
        return cls._shared

    def _call(self, uri: str, action: str, function: Callable[[], Any]) -> Any:
        """Run a transfer, retrying transient failures with exponential backoff (0.5 s, 1 s, 2 s, ...)."""
        from botocore.exceptions import BotoCoreError, ClientError

        for attempt in range(1, self.max_attempts + 1):
            try:
                return function()
            except ClientError as err:
                code = err.response.get("Error", {}).get("Code", "")
                if code in ("404", "NoSuchKey", "NoSuchBucket", "403", "AccessDenied") or attempt == self.max_attempts:
                    raise StorageError(f"{uri}: cannot {action}: {code or err}") from err
            except (BotoCoreError, OSError) as err:
                if attempt == self.max_attempts:
                    raise StorageError(f"{uri}: cannot {action} after {attempt} attempts: {err}") from err
            delay = 0.5 * 2 ** (attempt - 1)
            logger.warning("%s: %s failed (attempt %d of %d), retrying in %.1f s", uri, action, attempt,
                           self.max_attempts, delay)
            time.sleep(delay)

    def exists(self, uri: str) -> bool:
        from botocore.exceptions import ClientError

        bucket, key = split_uri(uri)
        try:
            self.client.head_object(Bucket=bucket, Key=key)
            return True
        except ClientError as err:
            if err.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return False
            raise StorageError(f"{uri}: cannot check: {err}") from err

    def read_bytes(self, uri: str) -> bytes:
        bucket, key = split_uri(uri)
        return self._call(uri, "read", lambda: self.client.get_object(Bucket=bucket, Key=key)["Body"].read())

    def write_bytes(self, uri: str, data: bytes) -> None:
        bucket, key = split_uri(uri)
        self._call(uri, "write", lambda: self.client.put_object(Bucket=bucket, Key=key, Body=data))

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
        scheme = prefix.partition("://")[0]  # answers keep the caller's scheme (s3 or minio)
        uris = []
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=key):
            uris.extend(f"{scheme}://{bucket}/{item['Key']}" for item in page.get("Contents", []))
        return sorted(uris)

    def delete(self, uri: str) -> None:
        bucket, key = split_uri(uri)
        self._call(uri, "delete", lambda: self.client.delete_object(Bucket=bucket, Key=key))

    def etag(self, uri: str) -> str:
        bucket, key = split_uri(uri)
        return self._call(uri, "stat", lambda: self.client.head_object(Bucket=bucket, Key=key)["ETag"].strip('"'))
