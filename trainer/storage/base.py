"""The `Storage` protocol and the URI helpers every backend shares.

The choice of backend by URI scheme is `trainer.storage.factory.get_storage`: this interface imports
no backend.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from trainer.errors import StorageError


class ConditionFailed(StorageError):
    """A conditional write found the object in another state than it required."""


class Storage(Protocol):
    """Whole-object operations on URIs. Writes are atomic: a reader sees the old object or the new one."""

    def exists(self, uri: str) -> bool: ...

    def read_bytes(self, uri: str) -> bytes: ...

    def write_bytes(self, uri: str, data: bytes) -> None: ...

    def upload_file(self, local_path: Path, uri: str) -> None: ...

    def download_file(self, uri: str, local_path: Path) -> None: ...

    def list(self, prefix: str) -> list[str]:
        """URIs of every object below `prefix` (recursively), sorted."""

    def delete(self, uri: str) -> None:
        """Delete one object; a missing one is not an error."""

    def etag(self, uri: str) -> str:
        """A string that changes whenever the object changes."""

    def size(self, uri: str) -> int:
        """The object's length in bytes."""

    def create_exclusive(self, uri: str, data: bytes) -> str | None:
        """Write `uri` only if nothing is there; return its etag, or None when an object already exists."""

    def replace_if_unchanged(self, uri: str, data: bytes, etag: str) -> str | None:
        """Overwrite `uri` only if its etag is still `etag`; return the new etag, or None when it changed."""


# Object-store schemes served by the S3 backend. `minio://` is how KFP names artifacts under a stock
# Kubeflow install's default MinIO pipeline root; it is the same S3 API at AWS_ENDPOINT_URL.
S3_SCHEMES = ("s3://", "minio://")


def is_remote(uri: str | Path) -> bool:
    return str(uri).startswith(S3_SCHEMES)


# What a storage URI may be, for messages.
SUPPORTED_LOCATIONS = "a local path, file://, s3:// or minio:// (with AWS_ENDPOINT_URL pointing at the MinIO service)"


def unsupported_scheme(uri: str | Path) -> str | None:
    """The scheme (`gs://`, `https://`, ...) of a `uri` no backend serves, or None for a path or a known scheme."""
    text = str(uri)
    if "://" not in text or text.startswith(("file://", *S3_SCHEMES)):
        return None
    return text.split("://", 1)[0] + "://"


def check_scheme(uri: str | Path) -> None:
    """StorageError naming `uri` if no backend serves its scheme (so it is never mistaken for a local path)."""
    scheme = unsupported_scheme(uri)
    if scheme:
        raise StorageError(f"{uri}: unsupported URI scheme {scheme}; expected {SUPPORTED_LOCATIONS}")


def join_uri(base: str | Path, *parts: str) -> str:
    """`base/part/part` for local paths and URIs alike."""
    text = str(base).rstrip("/")
    return "/".join([text, *(p.strip("/") for p in parts)])

