"""The object store behind the API stand-in: objects, resourceVersions, watch history, selectors.

It keeps what etcd and the API server's watch cache keep for the launcher's purposes:

- one resourceVersion counter for the whole cluster; every write bumps it and stamps the object;
- a history of events (ADDED, MODIFIED, DELETED) a watch replays from any resourceVersion after
  the last compaction; asking for an older one answers 410 Gone ("too old resource version"), as
  the real server does after compaction;
- equality-based label and field selectors (`a=b`, `a==b`, `a!=b`, comma-joined), field paths
  dotted (`metadata.name`, `involvedObject.kind`).
"""

from __future__ import annotations

import copy
import threading
import time
from datetime import datetime, timezone

KINDS = ("pytorchjobs", "pods", "events")


def now_rfc3339() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_selector(text: str) -> list[tuple[str, str, str]]:
    """`a=b,c!=d` -> [(a, '=', b), (c, '!=', d)]."""
    terms = []
    for item in filter(None, (part.strip() for part in (text or "").split(","))):
        for operator in ("!=", "==", "="):
            if operator in item:
                key, value = item.split(operator, 1)
                terms.append((key.strip(), "!=" if operator == "!=" else "=", value.strip()))
                break
    return terms


def _field(obj: dict, path: str) -> str:
    value: object = obj
    for part in path.split("."):
        value = value.get(part, "") if isinstance(value, dict) else ""
    return "" if value is None else str(value)


def matches(obj: dict, labels: str = "", fields: str = "") -> bool:
    object_labels = obj.get("metadata", {}).get("labels") or {}
    for key, operator, value in parse_selector(labels):
        if (object_labels.get(key) == value) != (operator == "="):
            return False
    for key, operator, value in parse_selector(fields):
        if (_field(obj, key) == value) != (operator == "="):
            return False
    return True


class Expired(Exception):
    """A watch asked for a resourceVersion older than the last compaction."""


class Store:
    """Objects of each kind by (namespace, name), with the history a watch replays."""

    def __init__(self) -> None:
        self.lock = threading.Condition()
        self.objects: dict[str, dict[tuple[str, str], dict]] = {kind: {} for kind in KINDS}
        self.history: list[tuple[int, str, str, dict]] = []  # (resourceVersion, kind, type, object)
        self.revision = 1
        self.compacted = 0
        self.uids = 0

    def _record(self, kind: str, event_type: str, obj: dict) -> dict:
        self.revision += 1
        obj["metadata"]["resourceVersion"] = str(self.revision)
        self.history.append((self.revision, kind, event_type, copy.deepcopy(obj)))
        self.lock.notify_all()
        return obj

    def create(self, kind: str, obj: dict) -> dict | None:
        """Store a new object; None if one of that name exists (409)."""
        with self.lock:
            metadata = obj["metadata"]
            key = (metadata["namespace"], metadata["name"])
            if key in self.objects[kind]:
                return None
            self.uids += 1
            metadata.update(uid=f"uid-{self.uids}", creationTimestamp=now_rfc3339(), generation=1)
            self.objects[kind][key] = obj
            return copy.deepcopy(self._record(kind, "ADDED", obj))

    def update(self, kind: str, key: tuple[str, str], change) -> dict | None:
        """Apply `change(obj)` to a stored object and record a MODIFIED event; None if it is gone."""
        with self.lock:
            obj = self.objects[kind].get(key)
            if obj is None:
                return None
            change(obj)
            return copy.deepcopy(self._record(kind, "MODIFIED", obj))

    def delete(self, kind: str, key: tuple[str, str]) -> dict | None:
        with self.lock:
            obj = self.objects[kind].pop(key, None)
            if obj is None:
                return None
            return copy.deepcopy(self._record(kind, "DELETED", obj))

    def get(self, kind: str, key: tuple[str, str]) -> dict | None:
        with self.lock:
            obj = self.objects[kind].get(key)
            return copy.deepcopy(obj) if obj is not None else None

    def list(self, kind: str, namespace: str, labels: str = "", fields: str = "") -> tuple[list[dict], str]:
        with self.lock:
            items = [copy.deepcopy(obj) for (ns, _), obj in self.objects[kind].items()
                     if ns == namespace and matches(obj, labels, fields)]
            return items, str(self.revision)

    def compact(self) -> int:
        """Forget the history up to now (and move the clock on): older resourceVersions expire."""
        with self.lock:
            self.revision += 1
            self.compacted = self.revision
            self.history = [entry for entry in self.history if entry[0] > self.compacted]
            return self.compacted

    def check_not_expired(self, version: int) -> None:
        """Where a watch may start: at or after the last compaction. Raises Expired."""
        with self.lock:
            if version < self.compacted:
                raise Expired(f"too old resource version: {version} ({self.compacted})")

    def events_after(self, kind: str, namespace: str, after: int, labels: str, fields: str,
                     timeout: float) -> tuple[list[tuple[int, str, dict]], int]:
        """Matching history entries newer than `after`, waiting up to `timeout` for one, and the revision
        they bring a watch to (a live watch moves past non-matching writes too)."""
        deadline = time.monotonic() + timeout
        with self.lock:
            while True:
                found = [(rv, event_type, copy.deepcopy(obj)) for rv, k, event_type, obj in self.history
                         if rv > after and k == kind and obj["metadata"]["namespace"] == namespace
                         and matches(obj, labels, fields)]
                remaining = deadline - time.monotonic()
                if found or remaining <= 0:
                    return found, self.revision
                self.lock.wait(remaining)
