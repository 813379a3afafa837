"""A stand-in for the Kubernetes API, on loopback, for the launcher's Kubernetes-mode tests.

No real cluster can run here; the client on the other side is the real `kubernetes` package. The
stand-in serves what the launcher calls, in the API's own JSON shapes and HTTP behaviour:

- `kubeflow.org/v1` PyTorchJobs: create (201; 409 when the name exists; 422 with field causes when
  the object is invalid against the CRD, validated as with `fieldValidation=Strict`, so an unknown
  field is refused rather than pruned), get (404 once deleted), list and watch with label and
  field selectors, delete (its pods go with it, as the garbage collector does);
- resourceVersions: every write bumps one counter; a list returns it; a watch streams (chunked
  HTTP/1.1, one JSON event per line) every change after the version it is given, or synthetic
  ADDED events when given none, until `timeoutSeconds`; a version older than the last compaction
  gets an ERROR event with a 410 Expired Status, as a real server after compaction;
- pods (list by label, get) with the status and conditions the scheduler and kubelet write;
  core/v1 events (list by field selector); a container's log with `tailLines`, `sinceSeconds`,
  `timestamps` and `limitBytes`, and 400 while the container is waiting to start.

The simulated operator, scheduler and kubelet are in `kube_cluster.py`, the store in
`kube_store.py`. Faults are injected per request (`fail_next`): an HTTP status with a Status body
(429 with Retry-After), a connection reset (RST) before the answer or in the middle of a watch, or
a compaction just before a watch, which then expires.
"""

from __future__ import annotations

import functools
import json
import re
import socket
import struct
import threading
import time
import urllib.parse
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tests.components.launcher.kube_cluster import SimulatedCluster, kubelet_timestamp
from tests.components.launcher.kube_store import Expired, Store

JOBS = re.compile(r"^/apis/kubeflow.org/v1/namespaces/([^/]+)/pytorchjobs(?:/([^/]+))?$")
PODS = re.compile(r"^/api/v1/namespaces/([^/]+)/pods(?:/([^/]+)(/log)?)?$")
EVENTS = re.compile(r"^/api/v1/namespaces/([^/]+)/events$")
LIST_KINDS = {"pytorchjobs": ("PyTorchJobList", "kubeflow.org/v1"), "pods": ("PodList", "v1"),
              "events": ("EventList", "v1")}


@dataclass
class Fault:
    """What the next `count` matching requests get instead of their answer."""

    method: str
    path: str  # a regex searched in the request path
    watch: bool | None  # None: watch requests and others alike
    action: int | str  # an HTTP status, "reset" (RST), or "expire" (compact, then serve)
    count: int = 1
    after_events: int = 0  # "reset" of a watch: sent after the headers and this many events
    retry_after: int | None = None
    skip: int = 0  # matching requests served normally before the fault applies


@dataclass
class Call:
    method: str
    path: str
    query: dict[str, str]


class KubeStandIn:
    """The API server: routes, faults, and the requests it saw. Use as a context manager."""

    def __init__(self, script: str = "succeed", step_seconds: float = 0.2, log_text: str = "",
                 pod_problem: str | None = None) -> None:
        self.store = Store()
        self.cluster = SimulatedCluster(self.store, script, step_seconds, log_text, pod_problem)
        self.calls: list[Call] = []
        self.created: list[tuple[str, str]] = []  # every job ever created, deleted or not
        self.faults: list[Fault] = []
        self.closing = threading.Event()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def host(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    @property
    def requests(self) -> list[tuple[str, str]]:
        return [(call.method, call.path) for call in self.calls]

    @property
    def jobs(self) -> dict[tuple[str, str], dict]:
        with self.store.lock:
            return dict(self.store.objects["pytorchjobs"])

    def __enter__(self) -> KubeStandIn:
        _validator()  # loaded once per process, before any request is timed
        self.thread.start()
        self.cluster.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.closing.set()
        self.cluster.stop.set()
        with self.store.lock:
            self.store.lock.notify_all()
        self.server.shutdown()
        self.server.server_close()

    def fail_next(self, method: str, path: str, action: int | str, *, count: int = 1, watch: bool | None = None,
                  after_events: int = 0, retry_after: int | None = None, skip: int = 0) -> None:
        self.faults.append(Fault(method, path, watch, action, count, after_events, retry_after, skip))

    def delete_job(self, namespace: str, name: str) -> None:
        """Someone else (kubectl, another controller) deletes the job."""
        if self.store.delete("pytorchjobs", (namespace, name)) is not None:
            self.cluster.job_deleted((namespace, name))

    def write_log(self, namespace: str, pod: str, text: str) -> None:
        with self.store.lock:
            self.cluster.write_log(namespace, pod, text)

    def _fault(self, method: str, path: str, is_watch: bool) -> Fault | None:
        with self.store.lock:
            for fault in self.faults:
                if (fault.count > 0 and fault.method == method and re.search(fault.path, path)
                        and fault.watch in (None, is_watch)):
                    if fault.skip:
                        fault.skip -= 1
                        return None
                    fault.count -= 1
                    return fault
        return None

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        from tests.components.launcher.kube_handlers import make_handler

        return make_handler(self)


def reset_connection(handler: BaseHTTPRequestHandler) -> None:
    """Close the client's connection with a TCP reset, as a dying proxy or server would."""
    handler.close_connection = True
    handler.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    handler.connection.close()


def log_response(standin: KubeStandIn, namespace: str, pod: dict, query: dict) -> tuple[int, object]:
    """(status, body) for a pod's log request, as the kubelet answers it through the API server."""
    name = pod["metadata"]["name"]
    container = query.get("container", "pytorch")
    if container not in [c["name"] for c in pod["spec"]["containers"]]:
        return 400, f"container {container} is not valid for pod {name}"
    statuses = pod.get("status", {}).get("containerStatuses") or []
    waiting = next((s["state"]["waiting"] for s in statuses if "waiting" in s.get("state", {})), None)
    if not statuses or waiting is not None:
        reason = (waiting or {}).get("reason", "ContainerCreating")
        return 400, f'container "{container}" in pod "{name}" is waiting to start: {reason}'
    with standin.store.lock:
        lines = list(standin.cluster.logs.get((namespace, name), []))
    if "sinceSeconds" in query:
        oldest = time.time_ns() - int(query["sinceSeconds"]) * 10**9
        lines = [(stamp, line) for stamp, line in lines if stamp >= oldest]
    if "tailLines" in query:
        lines = lines[-int(query["tailLines"]):] if int(query["tailLines"]) else []
    with_stamps = query.get("timestamps", "false").lower() == "true"
    text = "".join(f"{kubelet_timestamp(stamp)} {line}\n" if with_stamps else f"{line}\n" for stamp, line in lines)
    if "limitBytes" in query:
        text = text.encode()[:int(query["limitBytes"])].decode(errors="ignore")
    return 200, text


def watch_events(standin: KubeStandIn, kind: str, namespace: str, query: dict):
    """Yield watch event dicts until the request's timeout; an ERROR 410 first if its version expired."""
    labels, fields = query.get("labelSelector", ""), query.get("fieldSelector", "")
    deadline = time.monotonic() + float(query.get("timeoutSeconds", "1800"))
    version = query.get("resourceVersion", "")
    if version in ("", "0"):
        items, after = standin.store.list(kind, namespace, labels, fields)
        after = int(after)
        for item in items:
            yield {"type": "ADDED", "object": item}
    else:
        after = int(version)
        try:
            standin.store.check_not_expired(after)
        except Expired as err:
            yield {"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1", "metadata": {},
                                               "status": "Failure", "message": str(err), "reason": "Expired",
                                               "code": 410}}
            return
    while not standin.closing.is_set():
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return
        found, after = standin.store.events_after(kind, namespace, after, labels, fields, min(remaining, 0.5))
        for _, event_type, obj in found:
            yield {"type": event_type, "object": obj}


def list_body(standin: KubeStandIn, kind: str, namespace: str, query: dict) -> dict:
    items, version = standin.store.list(kind, namespace, query.get("labelSelector", ""),
                                        query.get("fieldSelector", ""))
    list_kind, api_version = LIST_KINDS[kind]
    return {"kind": list_kind, "apiVersion": api_version, "metadata": {"resourceVersion": version}, "items": items}


def status_body(code: int, reason: str, message: str, details: dict | None = None) -> dict:
    body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "code": code}
    if details:
        body["details"] = details
    return body


@functools.cache
def _validator():
    from tests.components.launcher.crd import pytorchjob_validator

    return pytorchjob_validator()


def invalid_job(job: dict) -> dict | None:
    """A 422 Status for a job the CRD schema refuses, in the API server's words; None if valid."""
    errors = sorted(_validator().iter_errors(job), key=lambda e: [str(p) for p in e.absolute_path])
    if not errors:
        return None
    name = job.get("metadata", {}).get("name", "")
    causes = [{"reason": "FieldValueInvalid", "field": ".".join(str(p) for p in e.absolute_path),
               "message": f"Invalid value: {json.dumps(e.instance)[:60]}: {e.message}"} for e in errors]
    message = f'PyTorchJob.kubeflow.org "{name}" is invalid: ' + ", ".join(f"{c['field']}: {c['message']}"
                                                                          for c in causes)
    return status_body(422, "Invalid", message, {"name": name, "group": "kubeflow.org", "kind": "PyTorchJob",
                                                  "causes": causes})


def parse_query(path: str) -> tuple[str, dict[str, str]]:
    url = urllib.parse.urlparse(path)
    return url.path, {key: values[0] for key, values in urllib.parse.parse_qs(url.query).items()}
