"""`get_storage`: the storage backend for a URI, chosen by its scheme.

It sits above the interface (`trainer.storage.base`) and the backends (`local`, `s3`), which import
only the interface. The S3 backend is imported only for an object-store URI, and boto3 only when it
is first used (`trainer.storage.s3`).
"""

from __future__ import annotations

from pathlib import Path

from trainer.storage.base import S3_SCHEMES, Storage, check_scheme
from trainer.storage.local import LocalStorage


def get_storage(uri: str | Path) -> Storage:
    """The backend for `uri`: S3 for `s3://` and `minio://`, the local filesystem for paths and `file://`.

    Args:
        uri: A local path, `file://`, `s3://` or `minio://` URI.

    Returns:
        The backend (the process's one S3 client for object stores).

    Raises:
        StorageError: The scheme is not one of those.
    """
    text = str(uri)
    if text.startswith(S3_SCHEMES):
        from trainer.storage.s3 import S3Storage

        return S3Storage.shared()
    check_scheme(text)
    return LocalStorage()
