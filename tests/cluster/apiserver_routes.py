"""The emulated API server's request handling: routing, authentication, RBAC, faults, the verbs.

A mixin of the HTTP handler in `apiserver.py` (kept apart so each file stays readable).
"""

from __future__ import annotations

import json
import time
import urllib.parse
from typing import Any

from tests.cluster.apiserver import CORE, DISCOVERY, GROUP, RESOURCES, copy_for_kind, merge_patch, prune, status_body
from tests.cluster.store import Conflict, NotFound, now_rfc3339

WATCH_DEFAULT_SECONDS = 1800


def qualified(resource: str) -> str:
    group = RESOURCES[resource][0]
    return f"{resource}.{group}" if group else resource


class Routes:
    """Mixin for BaseHTTPRequestHandler; `server_api` is the ApiServer."""

    server_api: Any

    # ---- plumbing

    def send_json(self, code: int, body: object, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)

    def send_status(self, code: int, reason: str, message: str, details: dict | None = None) -> None:
        self.send_json(code, status_body(code, reason, message, details))

    def read_body(self) -> dict:
        length = int(self.headers.get("Content-Length") or 0)
        return json.loads(self.rfile.read(length) or b"{}")

    # ---- dispatch

    def dispatch(self, method: str) -> None:
        api = self.server_api
        url = urllib.parse.urlparse(self.path)
        query = {k: v[-1] for k, v in urllib.parse.parse_qs(url.query).items()}
        discovery = DISCOVERY.match(url.path) if method == "GET" else None
        if discovery:
            return self._discovery(discovery.group("group"), discovery.group("version"))
        match = CORE.match(url.path) or GROUP.match(url.path)
        version = match.groupdict().get("version") if match else None
        if not match or match.group("res") not in RESOURCES or not api.is_served(match.group("res"), version):
            return self.send_status(404, "NotFound", f"the server could not find the requested resource ({url.path})")
        resource, namespace = match.group("res"), match.group("ns") or ""
        name, sub = match.group("name"), match.group("sub")
        group = RESOURCES[resource][0]
        is_watch = query.get("watch", "").lower() in ("true", "1")
        verb = self._verb(method, name, is_watch)
        scheme, _, token = (self.headers.get("Authorization") or "").partition(" ")
        user = api.authorizer.tokens.get(token.strip()) if scheme.lower() == "bearer" else None
        if user is None:
            return self.send_status(401, "Unauthorized", "Unauthorized")
        from tests.cluster.apiserver import Request

        api.requests.append(Request(verb, resource, namespace, name, sub, query, user))
        fault = api.fault_for(method, url.path, is_watch)
        if fault is not None:
            if fault.status == 0:  # a dropped connection (reset by a load balancer, an API server restart)
                self.close_connection = True
                self.connection.close()
                return None
            return self.send_status(fault.status, "ServiceUnavailable" if fault.status == 503 else "InternalError",
                                    f"injected fault {fault.status} for {method} {url.path}")
        checked = f"{resource}/{sub}" if sub and sub != "status" else resource
        if not api.authorizer.allows(user, verb, group, checked, namespace):
            what = f'{qualified(resource)} "{name}"' if name else qualified(resource)
            scope = f' in the namespace "{namespace}"' if namespace else " at the cluster scope"
            sub_text = f' with subresource "{sub}"' if sub and sub != "status" else ""
            return self.send_status(403, "Forbidden", f'{what} is forbidden: User "{user}" cannot {verb} resource '
                                    f'"{resource}"{sub_text} in API group "{group}"{scope}')
        try:
            self._serve(method, verb, resource, namespace, name, sub, query)
        except NotFound:
            self.send_status(404, "NotFound", f'{qualified(resource)} "{name}" not found',
                             {"name": name, "group": group, "kind": resource})
        except Conflict as err:
            self.send_status(409, "Conflict" if "modified" in str(err) else "AlreadyExists",
                             str(err).replace(resource, qualified(resource), 1))
        except (BrokenPipeError, ConnectionResetError):
            pass

    def _discovery(self, group: str, version: str) -> None:
        """`/apis/<group>/<version>`: any authenticated account may read it (the `system:discovery` role)."""
        scheme, _, token = (self.headers.get("Authorization") or "").partition(" ")
        if scheme.lower() != "bearer" or token.strip() not in self.server_api.authorizer.tokens:
            return self.send_status(401, "Unauthorized", "Unauthorized")
        listing = self.server_api.discovery(group, version)
        if listing is None:
            return self.send_status(404, "NotFound", "the server could not find the requested resource")
        return self.send_json(200, listing)

    @staticmethod
    def _verb(method: str, name: str | None, is_watch: bool) -> str:
        if method == "GET":
            return "watch" if is_watch else ("get" if name else "list")
        return {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(method) or \
            ("delete" if name else "deletecollection")

    def _serve(self, method: str, verb: str, resource: str, namespace: str, name: str | None, sub: str | None,
               query: dict[str, str]) -> None:
        store = self.server_api.store
        if sub == "log":
            return self._log(namespace, name, query)
        if verb == "get":
            return self.send_json(200, copy_for_kind(resource, store.get(resource, namespace, name)))
        if verb == "list":
            items, revision = store.list(resource, namespace or None, query.get("labelSelector", ""),
                                         query.get("fieldSelector", ""))
            group, _, kind, version = RESOURCES[resource]
            return self.send_json(200, {"kind": f"{kind}List", "apiVersion": f"{group}/{version}" if group else version,
                                        "metadata": {"resourceVersion": str(revision)},
                                        "items": [copy_for_kind(resource, item) for item in items]})
        if verb == "watch":
            return self._watch(resource, namespace, query)
        if verb == "create":
            return self._create(resource, namespace, self.read_body())
        if verb in ("update", "patch"):
            return self._update(resource, namespace, name, sub, self.read_body(), verb)
        if verb == "delete":
            return self._delete(resource, namespace, name)
        self.send_status(405, "MethodNotAllowed", f"{verb} is not supported by this emulated server")

    # ---- writes

    def _checked(self, resource: str, obj: dict, admit: bool = False) -> tuple[dict | None, dict[str, str]]:
        """The object to store and the response headers, or None after answering 422 (a schema violation, or
        with `admit` a refusal of the resource's admission webhook)."""
        api = self.server_api
        errors, unknown = api.validate(resource, obj)
        _, _, kind, _ = RESOURCES[resource]
        group = RESOURCES[resource][0]
        name = obj.get("metadata", {}).get("name", "")
        webhook = api.admission.get(resource) if admit and not errors else None
        refused = webhook(obj) if webhook is not None else []
        if refused:
            message = f'{kind}.{group} "{name}" is invalid: ' + "; ".join(refused)
            self.send_status(422, "Invalid", f'admission webhook "validator.{kind.lower()}.{group}" denied the '
                             f"request: {message}", {"name": name, "group": group, "kind": kind})
            return None, {}
        if errors:
            self.send_status(422, "Invalid", f'{kind}.{group or "core"} "{name}" is invalid: ' + "; ".join(errors),
                             {"name": name, "group": group, "kind": kind,
                              "causes": [{"reason": "FieldValueInvalid", "message": e} for e in errors]})
            return None, {}
        headers = {}
        if unknown:
            prune(obj, unknown)
            api.warnings.extend(unknown)
            headers["Warning"] = ", ".join(f'299 - "unknown field \\"{path}\\""' for path in unknown)
        return obj, headers

    def _create(self, resource: str, namespace: str, body: dict) -> None:
        body.setdefault("metadata", {})
        if RESOURCES[resource][1]:
            body["metadata"]["namespace"] = namespace
        body["metadata"].pop("resourceVersion", None)
        if not body["metadata"].get("name") and body["metadata"].get("generateName"):
            body["metadata"]["name"] = body["metadata"]["generateName"] + str(time.monotonic_ns())[-5:]
        obj, headers = self._checked(resource, body, admit=True)
        if obj is not None:
            self.send_json(201, copy_for_kind(resource, self.server_api.store.create(resource, obj)), headers)

    def _update(self, resource: str, namespace: str, name: str, sub: str | None, body: dict, verb: str) -> None:
        store = self.server_api.store
        current = store.get(resource, namespace, name)
        if verb == "patch":
            updated = merge_patch(current, body)
            updated["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        elif sub == "status":
            updated = {**current, "status": body.get("status")}
            updated["metadata"]["resourceVersion"] = body.get("metadata", {}).get(
                "resourceVersion", current["metadata"]["resourceVersion"])
        else:
            updated = body
            updated["metadata"].setdefault("resourceVersion", current["metadata"]["resourceVersion"])
        updated["metadata"]["name"] = name
        if namespace:
            updated["metadata"]["namespace"] = namespace
        obj, headers = self._checked(resource, updated)
        if obj is not None:
            self.send_json(200, copy_for_kind(resource, store.update(resource, obj)), headers)

    def _delete(self, resource: str, namespace: str, name: str) -> None:
        store = self.server_api.store
        if resource == "pods":  # graceful: the kubelet stops the containers, then removes the object
            obj = store.mutate("pods", namespace, name, lambda pod: pod["metadata"].setdefault(
                "deletionTimestamp", now_rfc3339()))
            if obj is None:
                raise NotFound(name)
            return self.send_json(200, copy_for_kind(resource, obj))
        obj = store.delete(resource, namespace, name)  # dependents go by garbage collection
        self.send_json(200, copy_for_kind(resource, obj))

    # ---- streams

    def _start_stream(self, content_type: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.end_headers()

    def _watch(self, resource: str, namespace: str, query: dict[str, str]) -> None:
        from tests.cluster.store import matches

        store = self.server_api.store
        labels, fields = query.get("labelSelector", ""), query.get("fieldSelector", "")
        deadline = time.monotonic() + float(query.get("timeoutSeconds") or WATCH_DEFAULT_SECONDS)
        requested = query.get("resourceVersion", "")
        epoch = self.server_api.watch_epoch
        with store.changed:
            if requested and requested != "0":
                last = int(requested)
                pending = store.events_since(last)
                if pending is None:
                    self._start_stream("application/json")
                    gone = status_body(410, "Expired", f"too old resource version: {requested} ({store.compacted_at})")
                    self.wfile.write((json.dumps({"type": "ERROR", "object": gone}) + "\n").encode())
                    return
                pending = [(e.type, e.object) for e in pending if e.resource == resource]
            else:
                items, last = store.list(resource, namespace or None, labels, fields)
                pending = [("ADDED", item) for item in items]
        self._start_stream("application/json")
        while True:
            for kind, obj in pending:
                if (not namespace or obj["metadata"].get("namespace") == namespace) and matches(obj, labels, fields):
                    event = {"type": kind, "object": copy_for_kind(resource, obj)}
                    self.wfile.write((json.dumps(event) + "\n").encode())
            self.wfile.flush()
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self.server_api.watch_epoch != epoch:
                return
            with store.changed:
                events = store.events_since(last)
                if not events:
                    store.changed.wait(timeout=min(remaining, 0.5))
                    events = store.events_since(last) or []
                if events:
                    last = events[-1].resource_version
                pending = [(e.type, e.object) for e in events if e.resource == resource]

    def _log(self, namespace: str, name: str, query: dict[str, str]) -> None:
        """A container's log as the kubelet serves it: sinceSeconds/sinceTime, tailLines, timestamps,
        limitBytes, follow."""
        api = self.server_api
        api.store.get("pods", namespace, name)  # 404 for a pod that does not exist
        try:
            log = api.log_source(namespace, name, query.get("container"))
        except LookupError as err:
            return self.send_status(400, "BadRequest", str(err))
        follow = query.get("follow", "").lower() in ("true", "1")
        since = 0.0
        if "sinceSeconds" in query:
            since = time.time() - int(query["sinceSeconds"])
        elif "sinceTime" in query:
            since = _parse_time(query["sinceTime"])
        with log.changed:
            entries = [(stamp, line) for stamp, line in zip(log.stamps, log.lines) if stamp >= since]
            sent = len(log.lines)
        if "tailLines" in query:
            entries = entries[len(entries) - min(len(entries), int(query["tailLines"])):]
        stamped = query.get("timestamps", "").lower() in ("true", "1")
        limit = int(query["limitBytes"]) if "limitBytes" in query else None
        data = _format(entries, stamped)[:limit]
        if not follow:
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        self._start_stream("text/plain")
        self.wfile.write(data)
        self.wfile.flush()
        while True:
            with log.changed:
                if len(log.lines) == sent and not log.finished:
                    log.changed.wait(timeout=0.5)
                new, finished = list(zip(log.stamps[sent:], log.lines[sent:])), log.finished
            if new:
                self.wfile.write(_format(new, stamped))
                self.wfile.flush()
                sent += len(new)
            elif finished:
                return


def _format(entries: list[tuple[float, str]], stamped: bool) -> bytes:
    if not stamped:
        return "".join(line + "\n" for _, line in entries).encode()
    return "".join(f"{_rfc3339_nano(stamp)} {line}\n" for stamp, line in entries).encode()


def _rfc3339_nano(stamp: float) -> str:
    seconds = int(stamp)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{int((stamp - seconds) * 1e9):09d}Z"


def _parse_time(text: str) -> float:
    import datetime

    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
