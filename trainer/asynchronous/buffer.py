"""Experience buffers, and the exactly-once contract between an explorer and the trainer.

- `QueueBuffer`: an in-process FIFO between an explorer thread and the `Trainer`.
- `FileBuffer`: a directory (local or `s3://`) of numbered batches that another process fills.
  Each batch is one whole object written only if the number is free (an atomic link locally, a
  conditional PUT on S3), so a reader never sees a partial batch and two explorers can never
  write the same number. Batches are safetensors (tensors, plus the version and info as JSON
  metadata), never pickles: anyone who can write the prefix could otherwise run code in the trainer.

Exactly once: batches are numbered 1, 2, ... for the life of the run. The trainer's position (the
number of the last batch it consumed, trained on or rejected) is part of its checkpoint; a resumed
trainer `seek`s to it and reads the batch after it. Reading deletes nothing: the trainer
`discard_through` a position only once a durable checkpoint covers it, recording it in `DISCARDED`
first. An explorer (re)started on the buffer continues after `last_written` (the highest number
written or discarded), so numbering survives explorer restarts and nothing is generated twice.

Markers: `CLOSED` (the explorer produced all its batches: a clean end) and `FAILED` (the explorer
failed; one line says why). A reader looks at them only when the next batch is not there, so
batches written before a marker are still read. `get` waits at most `timeout` seconds and raises
`WaitTimeout` rather than hanging; it returns None once the buffer is closed and drained, and
raises `ExplorerError` once it is failed and drained.
"""

from __future__ import annotations

import json
import queue
import time
from pathlib import Path
from typing import Protocol

from trainer.checkpointing.serialization import dump_tensors, load_json, load_tensors
from trainer.config import OnlineStageConfig
from trainer.errors import AlignflowError, DataError, WaitTimeout
from trainer.rollout.experience import Experience
from trainer.storage import get_storage, is_remote, join_uri

CLOSED_MARKER = "CLOSED"
FAILED_MARKER = "FAILED"
DISCARDED_FILE = "DISCARDED"
BATCH_PREFIX, BATCH_SUFFIX = "batch-", ".safetensors"


class ExplorerError(AlignflowError):
    """The explorer marked the buffer failed: no more experience will come until it is restarted."""


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
    @property
    def position(self) -> int:
        """Number of the last batch `get` returned (or `seek` set); 0 before the first."""

    def put(self, experience: Experience) -> int:
        """Append a batch; its number."""

    def get(self, timeout: float) -> Experience | None: ...

    def seek(self, position: int) -> None:
        """Read the batch after `position` next (a resumed trainer's checkpointed position)."""

    def last_written(self) -> int:
        """Highest batch number written (or discarded): an explorer continues after it."""

    def discard_through(self, position: int) -> None:
        """Delete batches up to `position`, which a durable checkpoint covers."""

    def close(self) -> None: ...

    def fail(self, reason: str) -> None: ...


class QueueBuffer:
    """An in-process FIFO; batch numbers are counted, not stored (the queue dies with the process)."""

    def __init__(self) -> None:
        self._queue: queue.Queue = queue.Queue()
        self._position = 0
        self._written = 0

    @property
    def position(self) -> int:
        return self._position

    def put(self, experience: Experience) -> int:
        self._written += 1
        self._queue.put(experience)
        return self._written

    def close(self) -> None:
        self._queue.put(None)

    def fail(self, reason: str) -> None:
        self._queue.put(ExplorerError(f"in-process buffer: the explorer failed: {reason}"))

    def seek(self, position: int) -> None:
        self._position = position
        self._written = max(self._written, position)

    def last_written(self) -> int:
        return self._written

    def discard_through(self, position: int) -> None:
        """Nothing to delete: a batch leaves the queue when it is read."""

    def get(self, timeout: float) -> Experience | None:
        try:
            item = self._queue.get(timeout=timeout)
        except queue.Empty:
            raise WaitTimeout(f"no experience in the in-process buffer for {timeout:g} s") from None
        if item is None or isinstance(item, ExplorerError):
            self._queue.put(item)  # stay closed (or failed) for later readers
            if item is not None:
                raise item
            return None
        self._position += 1
        return item


class FileBuffer:
    """Batches `batch-00000001.safetensors`, ... under a directory or `s3://` prefix (see the module docstring).

    Args:
        directory: Local path or `s3://` URI shared by the producer and the consumer.
        poll_interval: Seconds between looks for the next batch (default 0.05 locally, 0.5 on S3).
    """

    def __init__(self, directory: str | Path, poll_interval: float | None = None) -> None:
        self.directory = str(directory).rstrip("/")
        self.storage = get_storage(self.directory)
        self.poll_interval = poll_interval if poll_interval is not None else (
            0.5 if is_remote(self.directory) else 0.05)
        self._position = 0
        self._next_write: int | None = None

    # -- names --------------------------------------------------------------------------------------

    def _uri(self, index: int) -> str:
        return join_uri(self.directory, f"{BATCH_PREFIX}{index:08d}{BATCH_SUFFIX}")

    def _marker(self, name: str) -> str:
        return join_uri(self.directory, name)

    def batch_numbers(self) -> list[int]:
        """Numbers of the batches present, ascending."""
        numbers = []
        for uri in self.storage.list(self.directory):
            name = uri.rsplit("/", 1)[-1]
            digits = name[len(BATCH_PREFIX):-len(BATCH_SUFFIX)]
            if name.startswith(BATCH_PREFIX) and name.endswith(BATCH_SUFFIX) and digits.isdigit():
                numbers.append(int(digits))
        return sorted(numbers)

    def discarded_through(self) -> int:
        """The position up to which batches were deleted under a checkpoint (0 if none)."""
        uri = self._marker(DISCARDED_FILE)
        if not self.storage.exists(uri):
            return 0
        entry = load_json(self.storage.read_bytes(uri), uri, DataError)
        if not isinstance(entry.get("through"), int):
            raise DataError(f"{uri}: expected {{\"through\": N}}, found {json.dumps(entry)[:200]}")
        return entry["through"]

    # -- the producer's side ------------------------------------------------------------------------

    def last_written(self) -> int:
        """Highest batch number written or discarded; the next `put` writes the number after it."""
        return max(self.batch_numbers()[-1:] + [self.discarded_through()])

    def put(self, experience: Experience) -> int:
        """Write the next batch number (only if it is free); its number.

        Raises:
            DataError: The number is taken by another writer (two explorers on one buffer).
        """
        if self._next_write is None:
            self._next_write = self.last_written() + 1
        number, uri = self._next_write, self._uri(self._next_write)
        payload = encode_experience(experience)
        if self.storage.create_exclusive(uri, payload) is None and self.storage.read_bytes(uri) != payload:
            raise DataError(f"{uri} already exists: another explorer writes to {self.directory}; "
                            "stop it (one explorer per buffer) and restart this one")
        self._next_write += 1
        return number

    def close(self) -> None:
        self.storage.write_bytes(self._marker(CLOSED_MARKER), b"")

    def fail(self, reason: str) -> None:
        """Mark the buffer failed with a one-line `reason`; the trainer stops once it has read what came before."""
        line = " ".join(reason.split())[:500] or "unknown error"
        self.storage.write_bytes(self._marker(FAILED_MARKER), line.encode())

    def clear_markers(self) -> None:
        """Forget CLOSED and FAILED (an explorer is about to (re)start); batches and positions stay."""
        for name in (CLOSED_MARKER, FAILED_MARKER):
            self.storage.delete(self._marker(name))

    def reset(self) -> None:
        """Delete every batch, marker and position (a run starting over; no explorer may be running)."""
        for number in self.batch_numbers():
            self.storage.delete(self._uri(number))
        for name in (CLOSED_MARKER, FAILED_MARKER, DISCARDED_FILE):
            self.storage.delete(self._marker(name))
        self._position, self._next_write = 0, None

    # -- the consumer's side ------------------------------------------------------------------------

    @property
    def position(self) -> int:
        return self._position

    def is_closed(self) -> bool:
        return self.storage.exists(self._marker(CLOSED_MARKER))

    def failure(self) -> str | None:
        """The FAILED marker's reason, or None."""
        uri = self._marker(FAILED_MARKER)
        if not self.storage.exists(uri):
            return None
        return self.storage.read_bytes(uri).decode(errors="replace").strip() or "no reason given"

    def seek(self, position: int) -> None:
        """Read batch `position + 1` next. DataError if it was already discarded (that experience is gone)."""
        discarded = self.discarded_through()
        if position < discarded:
            raise DataError(f"{self._marker(DISCARDED_FILE)}: batches up to {discarded} were deleted after a "
                            f"checkpoint covered them, but the trainer resumes at batch {position + 1} (from an older "
                            "checkpoint); they cannot be trained on again: resume from a newer checkpoint or start "
                            "over with an empty buffer")
        self._position = position

    def get(self, timeout: float) -> Experience | None:
        deadline = time.monotonic() + timeout
        while True:
            uri = self._uri(self._position + 1)
            # Look at the markers before the batch: the producer writes its last batch before a
            # marker, so a marked buffer with no next batch really is drained.
            was_closed, failure = self.is_closed(), self.failure()
            if self.storage.exists(uri):
                experience = decode_experience(self.storage.read_bytes(uri), uri)
                self._position += 1
                return experience
            if failure is not None:
                raise ExplorerError(f"{self._marker(FAILED_MARKER)}: the explorer failed: {failure}")
            if was_closed:
                return None
            if time.monotonic() > deadline:
                raise WaitTimeout(f"{self.directory}: no batch {uri.rsplit('/', 1)[-1]} after {timeout:g} s "
                                  "(is the explorer running?)")
            time.sleep(self.poll_interval)

    def discard_through(self, position: int) -> None:
        """Record `position` in DISCARDED, then delete the batches up to it (a durable checkpoint covers them)."""
        if position <= self.discarded_through():
            return
        self.storage.write_bytes(self._marker(DISCARDED_FILE), json.dumps({"through": position}).encode())
        for number in self.batch_numbers():
            if number <= position:
                self.storage.delete(self._uri(number))


def buffer_dir(config: OnlineStageConfig) -> str:
    """Where the explorer and trainer of a run meet: `asynchronous.buffer_dir`, else `<output_dir>/buffer`."""
    return config.asynchronous.buffer_dir or join_uri(config.output_dir, "buffer")
