"""What a data path holds, by content: the part of a run's fingerprint that sees a dataset change in place.

A path names where the data is, not what it is: a file rewritten at the same path (a fixed row, a
new export) would otherwise resume a checkpoint trained on other data. `content_identity` maps
every file a data path stands for to an identity of its bytes:

- a local file: `sha256:<hex>` of its bytes, streamed in 1 MiB blocks. Hashing everything is the
  honest choice and cheap enough: about 0.1 s per 100 MB here (measured, sha256 with CPU hash
  instructions), so a 10 GB dataset costs seconds next to the minutes its loading and tokenizing
  take. Sampling (size + the first and last MiB) would be constant-time but miss an edited row in
  the middle, the case this exists for;
- an `s3://` (or `minio://`) object: `etag:<ETag>` from a HEAD request. The store computes it from
  the bytes on upload (MD5, or MD5 of the parts for a multipart upload), so a rewrite changes it
  without this process reading the object;
- a directory or prefix (an HF `datasets` directory): each file in it, by its path.

A path that does not exist gives {}: the data loader reports it with its own one-line error.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from trainer.storage import get_storage, is_remote
from trainer.storage.local import local_path

BLOCK_BYTES = 1 << 20


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(BLOCK_BYTES):
            digest.update(block)
    return f"sha256:{digest.hexdigest()}"


def content_identity(uri: str) -> dict[str, str]:
    """{file uri or path: identity of its bytes} for every file `uri` stands for ({} when there is none)."""
    if is_remote(uri):
        storage = get_storage(uri)
        files = [uri] if storage.exists(uri) else storage.list(uri)
        return {name: f"etag:{storage.etag(name)}" for name in files}
    path = local_path(uri)
    try:
        if path.is_file():
            return {str(path): file_sha256(path)}
        if path.is_dir():  # hidden entries (a `.cache` folder) are not part of the dataset
            return {str(file): file_sha256(file) for file in sorted(path.rglob("*"))
                    if file.is_file() and not any(part.startswith(".") for part in file.relative_to(path).parts)}
    except OSError:
        return {}  # unreadable: the data loader names it in its own error
    return {}
