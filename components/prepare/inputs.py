"""The bodies of `prepare_inputs` and `fingerprint_inputs`: copy datasets in, hash what they hold."""

from __future__ import annotations

import hashlib
from pathlib import Path

from trainer.errors import PipelineError, StorageError
from trainer.storage import get_storage


def copy_datasets(sources: dict[str, str]) -> None:
    """Copy each dataset URI to its artifact path (`{path: uri}`); an unused input (empty URI) becomes an empty file.

    Keyed by path: several inputs may share a URI (or be unused, ""), and each output must still be written.
    """
    for path, uri in sources.items():
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        if not uri:
            Path(path).write_bytes(b"")
            continue
        storage = get_storage(uri)
        if not storage.exists(uri):
            raise PipelineError(f"{uri}: dataset not found (expected a .jsonl or .parquet file)")
        storage.download_file(uri, Path(path))


def content_fingerprint(uris: list[str]) -> str:
    """A hash of what the URIs hold now (their ETags, or size and mtime locally), in order."""
    digest = hashlib.sha256()
    for uri in uris:
        digest.update(uri.encode() + b"\0")
        if not uri:
            continue
        try:
            storage = get_storage(uri)
            objects = [uri] if storage.exists(uri) else storage.list(uri)
            if not objects:
                raise PipelineError(f"{uri}: nothing there (no object and no objects below it)")
            for item in objects:
                digest.update(item.encode() + b"=" + storage.etag(item).encode() + b"\n")
        except (StorageError, OSError) as err:
            raise PipelineError(f"{uri}: cannot read it to fingerprint the inputs: {err}") from err
    return digest.hexdigest()
