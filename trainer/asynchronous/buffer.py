"""Experience buffers.

- `QueueBuffer`: an in-process FIFO between an explorer thread and the `Trainer`.
- `FileBuffer`: a directory (local or `s3://`) of batches that another process fills. Each batch
  is one whole object (a rename locally, one PUT on S3), so a reader never sees a partial one;
  a `CLOSED` marker says the producer is done.

`get` waits at most `timeout` seconds and raises `WaitTimeout` rather than hanging; it returns
None once the buffer is closed and drained.
"""

from __future__ import annotations

import io
import queue
import time
from pathlib import Path
from typing import Protocol

import torch

from trainer.config import OnlineStageConfig
from trainer.errors import WaitTimeout
from trainer.online.experience import Experience
from trainer.storage import get_storage, is_remote, join_uri

CLOSED_MARKER = "CLOSED"


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
    """Batches `batch-00000001.pt`, ... under a directory or `s3://` prefix, read in order and deleted once read.

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
        return sorted(int(n[len("batch-"):-len(".pt")]) for n in names if n.startswith("batch-") and n.endswith(".pt"))

    def _uri(self, index: int) -> str:
        return join_uri(self.directory, f"batch-{index:08d}.pt")

    def put(self, experience: Experience) -> None:
        payload = io.BytesIO()
        torch.save(experience, payload)
        self.storage.write_bytes(self._uri(self._next_write), payload.getvalue())
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
                experience = torch.load(io.BytesIO(self.storage.read_bytes(uri)), weights_only=False)
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
