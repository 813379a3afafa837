"""An exclusive, heartbeat-renewed lease on a run's `output_dir` (`<output_dir>/lease.json`).

Two runs writing one `output_dir` would share checkpoint names and interleave metrics, so rank 0
takes a lease before it writes anything: it creates `lease.json` only if none exists (an atomic
hard link locally, `If-None-Match: *` on S3) and renews it every quarter of the timeout (a
compare-and-swap on the ETag on S3). A second run fails at once with one line naming the holder
(host, pid, start time, last heartbeat). A lease whose heartbeat is older than the timeout, or
whose holder is a dead process on this host, is stale and is taken over (again by
compare-and-swap, so two runs cannot both take it). The lease is deleted when the run ends; a
killed run leaves it behind, which is what the staleness rule is for.

Limits: staleness compares the holder's wall clock with this host's, so clocks must agree to
well under the timeout; the local compare-and-swap is not atomic against a second writer in the
same instant (see `trainer.storage.local`).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from datetime import datetime, timezone
from typing import Any

from trainer.errors import LeaseError, StorageError
from trainer.storage import get_storage, join_uri

logger = logging.getLogger(__name__)

LEASE_FILE = "lease.json"


def describe(holder: dict[str, Any], now: float) -> str:
    age = now - float(holder.get("heartbeat", 0))
    return (f"host {holder.get('host', '?')}, pid {holder.get('pid', '?')}, started {holder.get('started', '?')}, "
            f"last heartbeat {age:.0f} s ago")


def is_process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Lease:
    """The lease of one run on `output_uri`.

    Args:
        output_uri: The run's `output_dir` (local path or s3:// URI).
        timeout_seconds: Heartbeat age after which the lease counts as abandoned.
    """

    def __init__(self, output_uri: str, timeout_seconds: float) -> None:
        self.uri = join_uri(output_uri, LEASE_FILE)
        self.storage = get_storage(self.uri)
        self.timeout_seconds = timeout_seconds
        self.holder = {"host": socket.gethostname(), "pid": os.getpid(),
                       "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                       "token": uuid.uuid4().hex, "heartbeat": time.time()}
        self._etag: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- reading --------------------------------------------------------------------------------------

    def read_holder(self) -> tuple[dict[str, Any] | None, str | None]:
        """The current holder and the lease's etag, or (None, None) when there is no lease."""
        try:
            if not self.storage.exists(self.uri):
                return None, None
            etag = self.storage.etag(self.uri)
            data = self.storage.read_bytes(self.uri)
        except (StorageError, FileNotFoundError):
            return None, None  # released between the calls
        try:
            holder = json.loads(data)
        except ValueError:
            holder = {}  # unreadable: treated as abandoned once its file is older than the timeout
        return holder if isinstance(holder, dict) else {}, etag

    def is_stale(self, holder: dict[str, Any]) -> bool:
        if holder.get("token") == self.holder["token"]:
            return False
        if holder.get("host") == self.holder["host"]:
            pid = int(holder.get("pid", -1))
            if pid == self.holder["pid"] or not is_process_alive(pid):
                return True  # an earlier run of this process, or a dead one on this host
        return time.time() - float(holder.get("heartbeat", 0)) > self.timeout_seconds

    def check_free(self) -> None:
        """Raise LeaseError if a live run holds the lease (reads only; `acquire` decides atomically)."""
        holder, _ = self.read_holder()
        if holder is not None and not self.is_stale(holder):
            raise self._held_error(holder)

    def _held_error(self, holder: dict[str, Any]) -> LeaseError:
        return LeaseError(f"{self.uri}: output_dir is in use by another run ({describe(holder, time.time())}); "
                          f"use another output_dir, or wait: the lease is taken over when its heartbeat is older "
                          f"than checkpoint.lease_timeout_seconds ({self.timeout_seconds:g} s)")

    # -- holding --------------------------------------------------------------------------------------

    def _payload(self) -> bytes:
        self.holder["heartbeat"] = time.time()
        return json.dumps(self.holder).encode()

    def acquire(self) -> None:
        """Take the lease (or a stale one) and start the heartbeat; raise LeaseError if a live run holds it."""
        for _ in range(5):
            self._etag = self.storage.create_exclusive(self.uri, self._payload())
            if self._etag is not None:
                break
            holder, etag = self.read_holder()
            if holder is None:
                continue  # released meanwhile: try to create it again
            if holder.get("token") == self.holder["token"]:
                self._etag = etag  # our own write, whose reply was lost and retried
                break
            if not self.is_stale(holder):
                raise self._held_error(holder)
            self._etag = self.storage.replace_if_unchanged(self.uri, self._payload(), etag)
            if self._etag is not None:
                logger.warning("%s: took over a stale lease (%s)", self.uri, describe(holder, time.time()))
                break
        else:
            raise LeaseError(f"{self.uri}: could not take the lease: other runs keep changing it")
        self._stop.clear()
        self._thread = threading.Thread(target=self._beat, name="lease-heartbeat", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        warned = False
        while not self._stop.wait(self.timeout_seconds / 4):
            try:
                etag = self.storage.replace_if_unchanged(self.uri, self._payload(), self._etag)
            except (StorageError, OSError) as err:
                if not warned:
                    logger.warning("%s: lease heartbeat failed (%s); retrying", self.uri, err)
                    warned = True
                continue
            if etag is None:
                holder, _ = self.read_holder()
                logger.error("%s: this run lost its lease to %s; another run now writes this output_dir", self.uri,
                             describe(holder or {}, time.time()))
                return
            self._etag, warned = etag, False

    def release(self) -> None:
        """Stop the heartbeat and delete the lease if it is still this run's."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        if self._etag is None:
            return
        holder, _ = self.read_holder()
        if holder is not None and holder.get("token") == self.holder["token"]:
            try:
                self.storage.delete(self.uri)
            except (StorageError, OSError) as err:
                logger.warning("%s: could not delete the lease (%s); it goes stale in %.0f s", self.uri, err,
                               self.timeout_seconds)
        self._etag = None
