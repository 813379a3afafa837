"""The HTTP side of the API stand-in: one handler class per stand-in, HTTP/1.1 with keep-alive."""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING

from tests.components.launcher.kube_standin import (
    EVENTS,
    JOBS,
    PODS,
    Call,
    invalid_job,
    list_body,
    log_response,
    parse_query,
    reset_connection,
    status_body,
    watch_events,
)

if TYPE_CHECKING:
    from tests.components.launcher.kube_standin import KubeStandIn


def make_handler(standin: KubeStandIn) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, and chunked watch streams, as the real server

        def log_message(self, *args: object) -> None:
            pass

        def finish(self) -> None:
            try:
                super().finish()
            except OSError:  # the connection was reset on purpose
                pass

        def _send(self, code: int, body: object, content_type: str = "application/json",
                  headers: dict | None = None) -> None:
            data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(data)

        def _status(self, code: int, reason: str, message: str, headers: dict | None = None) -> None:
            self._send(code, status_body(code, reason, message), headers=headers)

        def _begin(self, method: str):
            """Read the request; apply a fault. Returns (path, query, fault) or None when answered already."""
            length = int(self.headers.get("Content-Length") or 0)
            self.body = json.loads(self.rfile.read(length)) if length else None
            path, query = parse_query(self.path)
            standin.calls.append(Call(method, path, query))
            is_watch = query.get("watch", "false").lower() == "true"  # the client sends "True"
            fault = standin._fault(method, path, is_watch)
            if fault is None or fault.action == "expire":
                if fault is not None:
                    standin.store.compact()
                return path, query, None
            if fault.action == "reset" and not is_watch:
                reset_connection(self)
                return None
            if isinstance(fault.action, int):
                headers = {"Retry-After": str(fault.retry_after)} if fault.retry_after is not None else None
                reasons = {429: "TooManyRequests", 500: "InternalError", 503: "ServiceUnavailable",
                           504: "Timeout"}
                self._status(fault.action, reasons.get(fault.action, "InternalError"), "injected fault", headers)
                return None
            return path, query, fault  # a reset in the middle of a watch

        def do_POST(self) -> None:  # noqa: N802 - http.server's naming
            begun = self._begin("POST")
            if begun is None:
                return
            path, _, _ = begun
            match = JOBS.match(path)
            if not match:
                return self._status(404, "NotFound", path)
            job = self.body
            job["metadata"]["namespace"] = match.group(1)
            problem = invalid_job(job)
            if problem is not None:
                return self._send(422, problem)
            created = standin.store.create("pytorchjobs", job)
            if created is None:
                return self._status(409, "AlreadyExists",
                                    f'pytorchjobs.kubeflow.org "{job["metadata"]["name"]}" already exists')
            standin.created.append((match.group(1), job["metadata"]["name"]))
            standin.cluster.job_created(created)
            self._send(201, created)

        def do_GET(self) -> None:  # noqa: N802
            begun = self._begin("GET")
            if begun is None:
                return
            path, query, fault = begun
            for pattern, kind in ((JOBS, "pytorchjobs"), (PODS, "pods"), (EVENTS, "events")):
                match = pattern.match(path)
                if not match:
                    continue
                namespace = match.group(1)
                name = match.group(2) if match.lastindex and match.lastindex >= 2 else None
                if name is None:
                    if query.get("watch", "false").lower() == "true":
                        return self._watch(kind, namespace, query, fault)
                    return self._send(200, list_body(standin, kind, namespace, query))
                obj = standin.store.get(kind, (namespace, name))
                if obj is None:
                    return self._status(404, "NotFound", f'{kind} "{name}" not found')
                if kind == "pods" and match.group(3):
                    code, text = log_response(standin, namespace, obj, query)
                    if code != 200:
                        return self._status(code, "BadRequest", text)
                    return self._send(200, text, "text/plain")
                return self._send(200, obj)
            self._status(404, "NotFound", path)

        def _watch(self, kind: str, namespace: str, query: dict, fault) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            sent = 0
            try:
                for event in watch_events(standin, kind, namespace, query):
                    if fault is not None and sent >= fault.after_events:
                        return reset_connection(self)
                    data = (json.dumps(event) + "\n").encode()
                    self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                    self.wfile.flush()
                    sent += 1
                if fault is not None:
                    return reset_connection(self)
                self.wfile.write(b"0\r\n\r\n")
            except OSError:  # the client went away
                self.close_connection = True

        def do_DELETE(self) -> None:  # noqa: N802
            begun = self._begin("DELETE")
            if begun is None:
                return
            path, _, _ = begun
            match = JOBS.match(path)
            if not match or not match.group(2):
                return self._status(405, "MethodNotAllowed", path)
            key = (match.group(1), match.group(2))
            deleted = standin.store.delete("pytorchjobs", key)
            if deleted is None:
                return self._status(404, "NotFound", f'pytorchjobs.kubeflow.org "{key[1]}" not found')
            standin.cluster.job_deleted(key)
            self._send(200, deleted)

    return Handler
