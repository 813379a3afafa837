"""Experience buffers.

- `QueueBuffer`: an in-process FIFO between an explorer thread and the `Trainer`.
- `FileBuffer`: a directory (local or `s3://`) of batches that another process fills. Each batch
  is one whole object (a rename locally, one PUT on S3), so a reader never sees a partial one;
  a `CLOSED` marker says the producer is done. Batches are safetensors (tensors, plus the version
  and info as JSON metadata), never pickles: anyone who can write the prefix could otherwise run
  code in the trainer.

`get` waits at most `timeout` seconds and raises `WaitTimeout` rather than hanging; it returns
None once the buffer is closed and drained.
"""

from __future__ import annotations

import json
import queue
import time
from pathlib import Path
from typing import Protocol

from trainer.config import OnlineStageConfig
from trainer.errors import DataError, WaitTimeout
from trainer.online.experience import Experience
from trainer.serialization import dump_tensors, load_tensors
from trainer.storage import get_storage, is_remote, join_uri

CLOSED_MARKER = "CLOSED"
BATCH_SUFFIX = ".safetensors"


def encode_experience(experience: Experience) -> bytes:
    """An experience batch as safetensors: its tensors, and `version`/`info` as JSON metadata."""
    metadata = {"version": json.dumps(experience.version), "info": json.dumps(experience.info)}
    return dump_tensors(experience.as_batch(), metadata)


def decode_experience(payload: bytes, name: str) -> Experience:
    """The inverse of `encode_experience`; DataError naming `name` when the file is not a batch."""
    tensors, metadata = load_tensors(payload, name, DataError)
    known = set(Experience.__dataclass_fields__) - {"version", "info"}
    unknown = sorted(set(tensors) - known)
    if unknown:
        raise DataError(f"{name}: unknown experience fields {unknown}, expected some of {sorted(known)}")
    try:
        version, info = json.loads(metadata.get("version", "0")), json.loads(metadata.get("info", "{}"))
        if not isinstance(version, int) or not isinstance(info, dict):
            raise TypeError(f"version {version!r}, info {type(info).__name__}")
        return Experience(**tensors, version=version, info=info)
    except (ValueError, TypeError) as err:
        raise DataError(f"{name}: not an experience batch ({type(err).__name__}: {err})") from err


class ExperienceBuffer(Protocol):
    def put(self, experience: Experience) -> None: ...

    def get(self, timeout: float) -> Experience | None: ...

    def close(self) -> None: ...


class QueueBuffer:
    def __init__(self) -> None:
        self._queue: queue.Queue = queue.Queue()
        self._closed = False

    def put(self, experience: Experience) -> None:
        self._queue.put(experience)

    def close(self) -> None:
        self._closed = True
        self._queue.put(None)

    def get(self, timeout: float) -> Experience | None:
        try:
            item = self._queue.get(timeout=timeout)
        except queue.Empty:
            raise WaitTimeout(f"no experience in the in-process buffer for {timeout:g} s") from None
        if item is None:
            self._queue.put(None)  # stay closed for later readers
        return item


class FileBuffer:
    """Batches `batch-00000001.safetensors`, ... under a directory or `s3://` prefix, read in order and deleted once read.

    Every batch is one object written whole (a rename locally, one PUT on S3), so a reader never
    sees part of one.

    Args:
        directory: Local path or `s3://` URI shared by the producer and the consumer.
        poll_interval: Seconds between looks for the next batch (default 0.05 locally, 0.5 on S3).
    """

    def __init__(self, directory: str | Path, poll_interval: float | None = None) -> None:
        self.directory = str(directory).rstrip("/")
        self.storage = get_storage(self.directory)
        self.poll_interval = poll_interval if poll_interval is not None else (
            0.5 if is_remote(self.directory) else 0.05)
        existing = self._batch_indices()
        self._next_write = existing[-1] + 1 if existing else 1
        self._next_read = existing[0] if existing else 1

    def _batch_indices(self) -> list[int]:
        names = [uri.rsplit("/", 1)[-1] for uri in self.storage.list(self.directory)]
        return sorted(int(n[len("batch-"):-len(BATCH_SUFFIX)]) for n in names
                      if n.startswith("batch-") and n.endswith(BATCH_SUFFIX) and n[len("batch-"):-len(BATCH_SUFFIX)].isdigit())

    def _uri(self, index: int) -> str:
        return join_uri(self.directory, f"batch-{index:08d}{BATCH_SUFFIX}")

    def put(self, experience: Experience) -> None:
        self.storage.write_bytes(self._uri(self._next_write), encode_experience(experience))
        self._next_write += 1

    def close(self) -> None:
        self.storage.write_bytes(join_uri(self.directory, CLOSED_MARKER), b"")

    def reset(self) -> None:
        """Drop unread batches and the closed marker (a new producer is about to start)."""
        for index in self._batch_indices():
            self.storage.delete(self._uri(index))
        self.storage.delete(join_uri(self.directory, CLOSED_MARKER))
        self._next_write = self._next_read = 1

    def is_closed(self) -> bool:
        return self.storage.exists(join_uri(self.directory, CLOSED_MARKER))

    def get(self, timeout: float) -> Experience | None:
        deadline = time.monotonic() + timeout
        while True:
            uri = self._uri(self._next_read)
            # Look at the marker before the batch: the producer writes its last batch before the
            # marker, so a closed buffer with no next batch really is drained.
            was_closed = self.is_closed()
            if self.storage.exists(uri):
                experience = decode_experience(self.storage.read_bytes(uri), uri)
                self.storage.delete(uri)
                self._next_read += 1
                return experience
            if was_closed:
                return None
            if time.monotonic() > deadline:
                raise WaitTimeout(f"{self.directory}: no batch {uri.rsplit('/', 1)[-1]} after {timeout:g} s "
                                    "(is the explorer running?)")
            time.sleep(self.poll_interval)


def buffer_dir(config: OnlineStageConfig) -> str:
    """Where the explorer and trainer of a run meet: `asynchronous.buffer_dir`, else `<output_dir>/buffer`."""
    return config.asynchronous.buffer_dir or join_uri(config.output_dir, "buffer")
