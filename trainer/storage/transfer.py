"""Copying between local directories and storage URIs, and a local cache of remote inputs.

Remote datasets and models are downloaded once into `$ALIGNFLOW_CACHE_DIR` (default
`~/.cache/alignflow`), under a key made of the URI and the ETags of its objects, so a changed
object is fetched again and an unchanged one is not. A cache entry appears (by rename) only when
complete.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

from trainer.errors import StorageError
from trainer.storage.base import is_remote
from trainer.storage.factory import get_storage
from trainer.storage.local import local_path


def cache_root() -> Path:
    return Path(os.environ.get("ALIGNFLOW_CACHE_DIR", Path.home() / ".cache" / "alignflow"))


def upload_dir(local_dir: Path, uri: str, skip: tuple[str, ...] = ()) -> None:
    """Upload every file below `local_dir` to `uri/<relative path>`, except names in `skip`."""
    storage = get_storage(uri)
    for path in sorted(p for p in local_dir.rglob("*") if p.is_file() and p.name not in skip):
        storage.upload_file(path, f"{uri.rstrip('/')}/{path.relative_to(local_dir).as_posix()}")


def download_prefix(uri: str, local_dir: Path) -> list[Path]:
    """Download every object below `uri` into `local_dir`, keeping relative paths."""
    storage = get_storage(uri)
    prefix = uri.rstrip("/") + "/"
    paths = []
    for object_uri in storage.list(uri):
        target = local_dir / object_uri[len(prefix):]
        storage.download_file(object_uri, target)
        paths.append(target)
    return paths


def cached_copy(uri: str | Path) -> Path:
    """A local path holding `uri`: the path itself when local, else a cached download (file or directory)."""
    if not is_remote(uri):
        return local_path(uri)
    uri = str(uri).rstrip("/")
    storage = get_storage(uri)
    is_file = storage.exists(uri)
    objects = [uri] if is_file else storage.list(uri)
    if not objects:
        raise StorageError(f"{uri}: no such object or prefix")
    tags = "|".join(f"{o}={storage.etag(o)}" for o in objects)
    key = hashlib.sha256(f"{uri}|{tags}".encode()).hexdigest()[:24]
    name = uri.rsplit("/", 1)[-1]
    entry = cache_root() / key
    if not entry.exists():
        entry.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=entry.parent, prefix=f".{key}."))
        if is_file:
            storage.download_file(uri, staging / name)
        else:
            download_prefix(uri, staging / name)
        try:
            os.replace(staging, entry)
        except OSError:  # another process finished the same entry first
            shutil.rmtree(staging, ignore_errors=True)
    return entry / name
