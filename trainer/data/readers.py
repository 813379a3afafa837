"""Read rows from JSONL, Parquet or a local HF `datasets` directory, each with its location.

Every row comes with a `where` string (`file:line` for JSONL, `file:row N` otherwise) so a later
schema error can point at it. JSONL is UTF-8 (as JSON requires): a line that is not, like a line
that is not JSON, is a bad row.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from trainer.errors import DataError


def iter_rows(uri: str | Path) -> Iterator[tuple[str, object]]:
    """Yield `(where, row)` pairs. A row that is not valid JSON is yielded as a DataError instance.

    `uri` is a local path or an `s3://` URI (downloaded once into the local cache); `where` names
    the original URI.
    """
    from trainer.storage.transfer import cached_copy

    path = cached_copy(uri)
    if not path.exists():
        raise DataError(f"{uri}: no such file or directory")
    for where, row in _iter_local(path):
        yield where.replace(str(path), str(uri), 1), row


def _iter_local(path: Path) -> Iterator[tuple[str, object]]:
    kind = "directory" if path.is_dir() else _format(path)
    if kind == "directory":
        yield from _iter_hf_directory(path)
    elif kind == "jsonl":
        yield from _iter_jsonl(path)
    elif kind == "parquet":
        yield from _iter_parquet(path)
    else:
        raise DataError(f"{path}: unsupported data format {path.suffix!r}; expected .jsonl, .parquet or a datasets directory")


def _format(path: Path) -> str | None:
    """By extension; a file without one (a KFP Dataset artifact) by its first bytes."""
    if path.suffix in (".jsonl", ".json"):
        return "jsonl"
    if path.suffix == ".parquet":
        return "parquet"
    if path.suffix:
        return None
    with path.open("rb") as handle:
        head = handle.read(64)
    if head.startswith(b"PAR1"):
        return "parquet"
    return "jsonl" if head.lstrip()[:1] in (b"{", b"") else None


def _iter_jsonl(path: Path) -> Iterator[tuple[str, object]]:
    # Bytes, decoded line by line: a line that is not UTF-8 is a bad row with its line number (which
    # `skip_bad_rows` can skip), not a UnicodeDecodeError that ends the whole file.
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            if not raw.strip():
                continue
            where = f"{path}:{number}"
            try:
                yield where, json.loads(raw.decode("utf-8"))
            except UnicodeDecodeError as err:
                yield where, DataError(f"{where}: not UTF-8 text: byte 0x{raw[err.start]:02x} at byte {err.start + 1} "
                                       "of the line; save the file as UTF-8")
            except json.JSONDecodeError as err:
                yield where, DataError(f"{where}: invalid JSON: {err.msg} at column {err.colno}")


def _iter_parquet(path: Path) -> Iterator[tuple[str, object]]:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as err:  # pyarrow raises several unrelated types for a bad file
        raise DataError(f"{path}: cannot read Parquet: {err}") from err
    for number, row in enumerate(table.to_pylist(), start=1):
        yield f"{path}:row {number}", row


def _iter_hf_directory(path: Path) -> Iterator[tuple[str, object]]:
    import datasets

    try:
        dataset = datasets.load_from_disk(str(path))
    except Exception as err:  # datasets raises FileNotFoundError or its own errors
        raise DataError(f"{path}: not a saved HF datasets directory: {err}") from err
    if isinstance(dataset, datasets.DatasetDict):
        if "train" not in dataset:
            raise DataError(f"{path}: DatasetDict without a 'train' split (splits: {sorted(dataset)})")
        dataset = dataset["train"]
    for number, row in enumerate(dataset, start=1):
        yield f"{path}:row {number}", row
