"""The emulated API server's storage: objects by resource, namespace and name, with resourceVersions.

Every write takes the next resourceVersion (one counter for the whole store, as etcd's revision)
and appends a watch event (ADDED, MODIFIED, DELETED) to a history that watches replay from any
resourceVersion still in it; `compact` drops the history, so older watches get 410 Gone. An update
that names a stale resourceVersion is a conflict (409), as on a real server.
"""

from __future__ import annotations

import copy
import datetime
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass


def now_rfc3339() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class Conflict(Exception):
    """A write lost a race: the object exists already, or changed since it was read."""


class NotFound(Exception):
    pass


@dataclass(slots=True)
class WatchEvent:
    resource_version: int
    resource: str
    type: str
    object: dict


def _split_terms(text: str) -> list[str]:
    """A selector's comma-separated terms; commas inside `in (a, b)` sets do not split."""
    terms, depth, current = [], 0, ""
    for char in text or "":
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            terms.append(current)
            current = ""
        else:
            current += char
    return [term.strip() for term in [*terms, current] if term.strip()]


def parse_selector(text: str) -> list[tuple[str, str, str]]:
    """`a=b,c!=d,e,f in (x, y),g notin (z)` -> [(key, op, value)] for label and field selectors (equality,
    existence and sets; a set's value is its members joined by commas)."""
    terms = []
    for item in _split_terms(text):
        words = item.split(None, 1)
        if len(words) == 2 and words[1].split("(", 1)[0].strip() in ("in", "notin"):
            operator, members = words[1].split("(", 1)
            terms.append((words[0], operator.strip(), ",".join(m.strip() for m in members.rstrip(")").split(","))))
        elif "!=" in item:
            key, value = item.split("!=", 1)
            terms.append((key, "!=", value))
        elif "=" in item:
            key, value = item.split("=", 1)
            terms.append((key.rstrip("="), "=", value))
        elif item.startswith("!"):
            terms.append((item[1:], "!", ""))
        else:
            terms.append((item, "exists", ""))
    return terms


def _field(obj: dict, path: str) -> str | None:
    value: object = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return None if value is None else str(value)


def matches(obj: dict, label_selector: str = "", field_selector: str = "") -> bool:
    labels = obj["metadata"].get("labels") or {}
    for key, op, value in parse_selector(label_selector):
        if (op == "=" and labels.get(key) != value) or (op == "!=" and labels.get(key) == value) \
                or (op == "exists" and key not in labels) or (op == "!" and key in labels) \
                or (op == "in" and labels.get(key) not in value.split(",")) \
                or (op == "notin" and labels.get(key) in value.split(",")):
            return False
    for key, op, value in parse_selector(field_selector):
        if (op == "=" and _field(obj, key) != value) or (op == "!=" and _field(obj, key) == value):
            return False
    return True


class Store:
    """Thread-safe objects and their change history. `changed` is notified on every write."""

    def __init__(self) -> None:
        self.changed = threading.Condition()
        self.revision = 0
        self.objects: dict[tuple[str, str, str], dict] = {}
        self.history: list[WatchEvent] = []
        self.compacted_at = 0

    def _commit(self, resource: str, kind: str, obj: dict) -> dict:
        self.revision += 1
        obj["metadata"]["resourceVersion"] = str(self.revision)
        self.history.append(WatchEvent(self.revision, resource, kind, copy.deepcopy(obj)))
        self.changed.notify_all()
        return copy.deepcopy(obj)

    def create(self, resource: str, obj: dict) -> dict:
        obj = copy.deepcopy(obj)
        meta = obj["metadata"]
        key = (resource, meta.get("namespace", ""), meta["name"])
        with self.changed:
            if key in self.objects:
                raise Conflict(f'{resource} "{meta["name"]}" already exists')
            meta.update(uid=str(uuid.uuid4()), creationTimestamp=now_rfc3339(), generation=1)
            self.objects[key] = obj
            return self._commit(resource, "ADDED", obj)

    def get(self, resource: str, namespace: str, name: str) -> dict:
        with self.changed:
            try:
                return copy.deepcopy(self.objects[(resource, namespace, name)])
            except KeyError:
                raise NotFound(f'{resource} "{name}" not found') from None

    def list(self, resource: str, namespace: str | None = None, label_selector: str = "",
             field_selector: str = "") -> tuple[list[dict], int]:
        """Matching objects (namespace None: all namespaces) and the revision they were read at."""
        with self.changed:
            items = [copy.deepcopy(obj) for (kind, ns, _), obj in sorted(self.objects.items())
                     if kind == resource and (namespace is None or ns == namespace)
                     and matches(obj, label_selector, field_selector)]
            return items, self.revision

    def update(self, resource: str, obj: dict, check_version: bool = True) -> dict:
        obj = copy.deepcopy(obj)
        meta = obj["metadata"]
        key = (resource, meta.get("namespace", ""), meta["name"])
        with self.changed:
            current = self.objects.get(key)
            if current is None:
                raise NotFound(f'{resource} "{meta["name"]}" not found')
            if check_version and meta.get("resourceVersion") != current["metadata"]["resourceVersion"]:
                raise Conflict(f'Operation cannot be fulfilled on {resource} "{meta["name"]}": the object has been '
                               "modified; please apply your changes to the latest version and try again")
            for field in ("uid", "creationTimestamp"):
                meta[field] = current["metadata"][field]
            meta["generation"] = current["metadata"].get("generation", 1) + (obj.get("spec") != current.get("spec"))
            self.objects[key] = obj
            return self._commit(resource, "MODIFIED", obj)

    def mutate(self, resource: str, namespace: str, name: str, change: Callable[[dict], None]) -> dict | None:
        """Read-modify-write under the lock (what a controller does with retries on conflict)."""
        with self.changed:
            current = self.objects.get((resource, namespace, name))
            if current is None:
                return None
            updated = copy.deepcopy(current)
            change(updated)
            if updated == current:
                return copy.deepcopy(current)
            return self.update(resource, updated, check_version=False)

    def delete(self, resource: str, namespace: str, name: str) -> dict:
        with self.changed:
            obj = self.objects.pop((resource, namespace, name), None)
            if obj is None:
                raise NotFound(f'{resource} "{name}" not found')
            return self._commit(resource, "DELETED", obj)

    def events_since(self, resource_version: int) -> list[WatchEvent] | None:
        """Events after `resource_version`; None when that version was compacted away (410 Gone)."""
        if resource_version < self.compacted_at:
            return None
        return [event for event in self.history if event.resource_version > resource_version]

    def compact(self) -> None:
        """Forget the change history, as etcd compaction does: older watches get 410 Gone."""
        with self.changed:
            self.history.clear()
            self.compacted_at = self.revision
