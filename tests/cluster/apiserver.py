"""A Kubernetes API server on loopback (HTTPS, bearer tokens, RBAC) for the cluster-faithful tests.

It serves the REST paths the real `kubernetes` client calls, in the API's own JSON shapes:
create/get/list/watch/replace/patch/delete of core objects (pods, secrets, configmaps, events,
services, nodes), of `kubeflow.org/v1` PyTorchJobs and of Kubeflow Trainer v2's
`trainer.kubeflow.org/v1alpha1` TrainJobs, TrainingRuntimes and ClusterTrainingRuntimes (each custom
resource only when the cluster `serves` it: a cluster with only the Training Operator, only Kubeflow
Trainer, or both), discovery of an API group version (`/apis/<group>/<version>`, which every
authenticated account may read), and pod logs (with `tailLines` and `follow`). Like a real server it

- authenticates the bearer token and authorizes each call against RBAC rules (403 names the verb,
  the resource and the namespace, as the real message does);
- validates custom resources against their CRDs' schemas (vendored in `tests/schemas/`): a schema
  violation is 422 Invalid; an unknown field is pruned and answered with a `Warning` header (the
  server's default `fieldValidation=Warn`), and recorded in `warnings` so a test can insist there are
  none; then runs the admission webhook registered for the resource (Kubeflow Trainer's for TrainJobs,
  `trainer_controller.py`), whose refusal is a 422 naming the webhook;
- keeps resourceVersions (409 on a stale update), replays watches from a resourceVersion, and
  answers 410 Gone (as a watch ERROR event) once that version was compacted away;
- can be told to fail requests (`Fault`: a status such as 503 or 429, or a dropped connection),
  and to end every open watch (`close_watches`), to prove clients survive what a real control
  plane does now and then.

What it leaves out: admission webhooks, server-side apply, strategic merge semantics (a PATCH is
a JSON merge patch), field managers, and every resource the tests do not use.
"""

from __future__ import annotations

import copy
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.cluster.store import Store

# resource -> (API group, namespaced, kind, version)
RESOURCES = {
    "pods": ("", True, "Pod", "v1"), "secrets": ("", True, "Secret", "v1"),
    "configmaps": ("", True, "ConfigMap", "v1"), "events": ("", True, "Event", "v1"),
    "services": ("", True, "Service", "v1"), "serviceaccounts": ("", True, "ServiceAccount", "v1"),
    "nodes": ("", False, "Node", "v1"), "pytorchjobs": ("kubeflow.org", True, "PyTorchJob", "v1"),
    "trainjobs": ("trainer.kubeflow.org", True, "TrainJob", "v1alpha1"),
    "trainingruntimes": ("trainer.kubeflow.org", True, "TrainingRuntime", "v1alpha1"),
    "clustertrainingruntimes": ("trainer.kubeflow.org", False, "ClusterTrainingRuntime", "v1alpha1"),
    "workloads": ("kueue.x-k8s.io", True, "Workload", "v1beta2"),  # Kueue's, written by tests as Kueue would
}
# Resources served at more versions than their storage one: Kueue 0.15+ serves Workloads at v1beta2 (storage) and
# the deprecated v1beta1; `ApiServer.versions` narrows it (an older Kueue serves v1beta1 only).
SERVED_VERSIONS = {"workloads": ("v1beta2", "v1beta1")}
CUSTOM_RESOURCES = {"pytorchjobs", "trainjobs", "trainingruntimes", "clustertrainingruntimes"}
TRAINING_OPERATOR = frozenset({"pytorchjobs"})
KUBEFLOW_TRAINER = frozenset({"trainjobs", "trainingruntimes", "clustertrainingruntimes"})
CORE = re.compile(r"^/api/v1(?:/namespaces/(?P<ns>[^/]+))?/(?P<res>[a-z]+)(?:/(?P<name>[^/]+))?(?:/(?P<sub>[a-z]+))?$")
GROUP = re.compile(r"^/apis/(?P<group>[^/]+)/(?P<version>[^/]+)(?:/namespaces/(?P<ns>[^/]+))?/(?P<res>[a-z]+)"
                   r"(?:/(?P<name>[^/]+))?(?:/(?P<sub>[a-z]+))?$")
DISCOVERY = re.compile(r"^/apis/(?P<group>[^/]+)/(?P<version>[^/]+)/?$")
NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


@dataclass
class Fault:
    """Fail matching requests: `status` (e.g. 503) or 0 to drop the connection; `times` at most."""

    method: str
    path: str  # a regular expression searched in the request path
    status: int = 503
    times: int = 1
    watch: bool | None = None  # True: only watch requests; False: only non-watch; None: both
    when: Callable[[], bool] | None = None  # only once this is true (e.g. "the job is Running")
    hits: int = 0


@dataclass
class Request:
    verb: str
    resource: str
    namespace: str
    name: str | None
    subresource: str | None
    query: dict[str, str]
    user: str
    time: float = field(default_factory=time.monotonic)


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


class Authorizer:
    """RBAC as data: user -> rules ({apiGroups, resources, verbs}, `*` allowed), per namespace or cluster-wide."""

    def __init__(self) -> None:
        self.tokens: dict[str, str] = {}
        self.rules: dict[tuple[str, str], list[dict]] = {}  # (user, namespace or "*") -> rules

    def add_token(self, token: str, user: str) -> None:
        self.tokens[token] = user

    def grant(self, user: str, rules: list[dict], namespace: str = "*") -> None:
        self.rules.setdefault((user, namespace), []).extend(rules)

    def allows(self, user: str, verb: str, group: str, resource: str, namespace: str) -> bool:
        rules = self.rules.get((user, namespace), []) + self.rules.get((user, "*"), [])
        return any(_matches(rule.get("apiGroups", []), group) and _matches(rule.get("resources", []), resource)
                   and _matches(rule.get("verbs", []), verb) for rule in rules)


def _matches(allowed: list[str], value: str) -> bool:
    return "*" in allowed or value in allowed


class ApiServer:
    """The server. `log_source(namespace, pod, container)` returns the kubelet's log of a container."""

    def __init__(self, store: Store, ssl_context: Any, serves: frozenset[str] = TRAINING_OPERATOR | KUBEFLOW_TRAINER) -> None:
        self.store = store
        self.authorizer = Authorizer()
        self.serves = frozenset(serves)
        """The custom resources this cluster has CRDs for; the others answer 404 like any unknown path."""
        self.versions: dict[str, tuple[str, ...]] = dict(SERVED_VERSIONS)
        """resource -> the API versions it is served at (default: `RESOURCES`' one); another answers 404."""
        self.trainer_release = ""
        """Whose CRDs Kubeflow Trainer's resources are checked against (`tests.schemas.TRAINER_RELEASES`)."""
        self.admission: dict[str, Callable[[dict], list[str]]] = {}
        """resource -> a validating webhook: the problems it finds in an object about to be created."""
        self.faults: list[Fault] = []
        self.requests: list[Request] = []
        self.warnings: list[str] = []
        self.log_source: Callable[[str, str, str | None], Any] | None = None
        self.watch_epoch = 0  # close_watches() bumps it: every open watch stream ends
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.server.daemon_threads = True
        self.server.socket = ssl_context.wrap_socket(self.server.socket, server_side=True,
                                                     do_handshake_on_connect=False)
        # stop() waits for serve_forever's next poll: 0.05 s apart instead of the default 0.5 s per cluster torn down.
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True,
                                       name="apiserver")

    @property
    def port(self) -> int:
        return self.server.server_address[1]

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def close_watches(self) -> None:
        """End every open watch stream, as an API server restart (or a load balancer) does."""
        with self.store.changed:
            self.watch_epoch += 1
            self.store.changed.notify_all()

    def calls(self, verb: str | None = None, resource: str | None = None, user: str | None = None) -> list[Request]:
        return [r for r in self.requests if (verb is None or r.verb == verb)
                and (resource is None or r.resource == resource) and (user is None or r.user == user)]

    def fault_for(self, method: str, path: str, is_watch: bool) -> Fault | None:
        for fault in self.faults:
            if fault.hits < fault.times and fault.method == method and re.search(fault.path, path) \
                    and (fault.watch is None or fault.watch == is_watch) and (fault.when is None or fault.when()):
                fault.hits += 1
                return fault
        return None

    def validate(self, resource: str, obj: dict) -> tuple[list[str], list[str]]:
        """(errors, pruned field paths) of an object about to be stored."""
        errors = []
        name = obj.get("metadata", {}).get("name", "")
        if not NAME.match(name) or len(name) > 253:
            errors.append(f"metadata.name: Invalid value: {name!r}: a lowercase RFC 1123 subdomain must consist of "
                          "lower case alphanumeric characters, '-' or '.'")
        pruned: list[str] = []
        if resource in CUSTOM_RESOURCES:
            from tests.schemas import problems as crd_problems

            group = RESOURCES[resource][0]
            release = self.trainer_release if group == "trainer.kubeflow.org" else ""
            problems = crd_problems(f"{resource}.{group}", obj, release)
            if release == "trainer-v2.4":
                from tests.schemas import trainer_v24_problems

                problems += trainer_v24_problems(obj)
            errors += [p for p in problems if not p.startswith("unknown field ")]
            pruned = [p.removeprefix("unknown field ") for p in problems if p.startswith("unknown field ")]
        return errors, pruned

    def is_served(self, resource: str, version: str | None = None) -> bool:
        """Whether `resource` (at `version`, where the path names one) is served here."""
        if version is not None and version not in self.versions.get(resource, (RESOURCES[resource][3],)):
            return False
        return resource not in CUSTOM_RESOURCES or resource in self.serves

    def discovery(self, group: str, version: str) -> dict | None:
        """The APIResourceList of a served group version, or None (404) when it serves nothing there."""
        served = [(name, spec) for name, spec in RESOURCES.items()
                  if spec[0] == group and spec[3] == version and self.is_served(name)]
        if not served:
            return None
        verbs = ["create", "delete", "get", "list", "patch", "update", "watch"]
        return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": f"{group}/{version}",
                "resources": [{"name": name, "singularName": spec[2].lower(), "namespaced": spec[1], "kind": spec[2],
                               "verbs": verbs} for name, spec in served]}


def prune(obj: dict, paths: list[str]) -> None:
    """Drop the fields at dotted paths (`spec.a[0].b`), as the server prunes unknown fields of a CR."""
    for path in paths:
        parts = [p for p in re.split(r"\.|\[(\d+)\]", path) if p]
        target: Any = obj
        for part in parts[:-1]:
            target = target[int(part)] if part.isdigit() else target.get(part, {})
        if isinstance(target, dict):
            target.pop(parts[-1], None)


def _handler(api: ApiServer) -> type[BaseHTTPRequestHandler]:
    from tests.cluster.apiserver_routes import Routes

    class Handler(Routes, BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"  # every answer closes its connection; a watch ends when it does
        server_api = api

        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            self.dispatch("GET")

        def do_POST(self) -> None:  # noqa: N802
            self.dispatch("POST")

        def do_PUT(self) -> None:  # noqa: N802
            self.dispatch("PUT")

        def do_PATCH(self) -> None:  # noqa: N802
            self.dispatch("PATCH")

        def do_DELETE(self) -> None:  # noqa: N802
            self.dispatch("DELETE")

    return Handler


def status_body(code: int, reason: str, message: str, details: dict | None = None) -> dict:
    body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "code": code}
    if details:
        body["details"] = details
    return body


def copy_for_kind(resource: str, obj: dict) -> dict:
    group, _, kind, version = RESOURCES[resource]
    out = copy.deepcopy(obj)
    out.setdefault("apiVersion", f"{group}/{version}" if group else version)
    out.setdefault("kind", kind)
    return out

