"""Experience buffers.

- `ReplayBuffer`: the `data_buffer` of `OLTrainer`: an episode's experiences, cleared after it.
- `QueueBuffer`: an in-process FIFO between an explorer thread and the `Trainer`.
- `FileBuffer`: a directory of batches that another process fills. Each batch is written to a
  temporary name and renamed (atomic on one filesystem), so a reader never sees a partial file;
  a `CLOSED` marker says the producer is done.

`get` waits at most `timeout` seconds and raises `BufferTimeout` rather than hanging; it returns
None once the buffer is closed and drained.
"""

from __future__ import annotations

import os
import queue
import time
from pathlib import Path
from typing import Protocol

import torch

from trainer.errors import AlignflowError
from trainer.experience import Experience

CLOSED_MARKER = "CLOSED"


class BufferTimeout(AlignflowError):
    """No experience arrived within the wait timeout."""


class ExperienceBuffer(Protocol):
    def put(self, experience: Experience) -> None: ...

    def get(self, timeout: float) -> Experience | None: ...

    def close(self) -> None: ...


class ReplayBuffer:
    """A list of experiences with the operations OLTrainer needs."""

    def __init__(self) -> None:
        self.items: list[Experience] = []

    def append(self, experience: Experience) -> None:
        self.items.append(experience)

    def clear(self) -> None:
        self.items.clear()

    def __len__(self) -> int:
        return len(self.items)


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
            raise BufferTimeout(f"no experience in the in-process buffer for {timeout:g} s") from None
        if item is None:
            self._queue.put(None)  # stay closed for later readers
        return item


class FileBuffer:
    """Batches `batch-00000001.pt`, ... in `directory`, read in order and deleted once read.

    Args:
        directory: Shared between the producer and the consumer.
        poll_interval: Seconds between looks for the next batch.
    """

    def __init__(self, directory: str | Path, poll_interval: float = 0.05) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.poll_interval = poll_interval
        existing = sorted(self.directory.glob("batch-*.pt"))
        self._next_write = int(existing[-1].stem.split("-")[1]) + 1 if existing else 1
        self._next_read = int(existing[0].stem.split("-")[1]) if existing else 1

    def _path(self, index: int) -> Path:
        return self.directory / f"batch-{index:08d}.pt"

    def put(self, experience: Experience) -> None:
        temporary = self.directory / f".batch-{self._next_write:08d}.tmp"
        torch.save(experience, temporary)
        os.replace(temporary, self._path(self._next_write))
        self._next_write += 1

    def close(self) -> None:
        (self.directory / CLOSED_MARKER).touch()

    def reset(self) -> None:
        """Drop unread batches and the closed marker (a new producer is about to start)."""
        for path in [*self.directory.glob("batch-*.pt"), self.directory / CLOSED_MARKER]:
            path.unlink(missing_ok=True)
        self._next_write = self._next_read = 1

    def is_closed(self) -> bool:
        return (self.directory / CLOSED_MARKER).exists()

    def get(self, timeout: float) -> Experience | None:
        deadline = time.monotonic() + timeout
        while True:
            path = self._path(self._next_read)
            # Look at the marker before the file: the producer writes its last batch before the
            # marker, so a closed buffer with no next file really is drained.
            was_closed = self.is_closed()
            if path.exists():
                experience = torch.load(path, weights_only=False)
                path.unlink()
                self._next_read += 1
                return experience
            if was_closed:
                return None
            if time.monotonic() > deadline:
                raise BufferTimeout(f"{self.directory}: no batch {path.name} after {timeout:g} s "
                                    "(is the explorer running?)")
            time.sleep(self.poll_interval)
