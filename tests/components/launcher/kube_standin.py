"""A stand-in for the Kubernetes API, on loopback, for the launcher's Kubernetes-mode tests.

It serves the calls the launcher makes, in the API's own JSON shapes: create/get/list/watch/
delete of `kubeflow.org/v1` PyTorchJobs, listing pods by label and reading a pod's log. A created
job walks through a scripted list of conditions, one every `step_seconds`, the way the Training
Operator would set them. No real cluster can run here; the client on the other side is the real
`kubernetes` package.
"""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SCRIPTS = {
    "succeed": ["Created", "Running", "Succeeded"],
    "fail": ["Created", "Running", "Failed"],
    "restart": ["Created", "Running", "Restarting", "Running", "Succeeded"],
    "hang": ["Created", "Running"],
}
JOBS = re.compile(r"^/apis/kubeflow.org/v1/namespaces/([^/]+)/pytorchjobs(?:/([^/]+))?$")
PODS = re.compile(r"^/api/v1/namespaces/([^/]+)/pods(?:/([^/]+)/log)?$")


class KubeStandIn:
    """The server's state: jobs by (namespace, name), their scripts, and the requests seen."""

    def __init__(self, script: str = "succeed", step_seconds: float = 0.2, log_text: str = "") -> None:
        self.script = SCRIPTS[script]
        self.step_seconds = step_seconds
        self.log_text = log_text
        self.jobs: dict[tuple[str, str], dict] = {}
        self.created_at: dict[tuple[str, str], float] = {}
        self.requests: list[tuple[str, str]] = []
        self.created: list[tuple[str, str]] = []  # every job ever created, deleted or not
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def host(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> KubeStandIn:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def current(self, key: tuple[str, str]) -> dict:
        """The job with the conditions its script has reached by now."""
        job = self.jobs[key]
        steps = int((time.monotonic() - self.created_at[key]) / self.step_seconds) + 1
        reached = self.script[:min(steps, len(self.script))]
        conditions = [{"type": phase, "status": "False"} for phase in reached[:-1]]
        conditions.append({"type": reached[-1], "status": "True"})
        return {**job, "status": {"conditions": conditions}}

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        standin = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"  # a watch stream ends when the connection closes

            def log_message(self, *args: object) -> None:
                pass

            def _send(self, code: int, body: object, content_type: str = "application/json") -> None:
                data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _status(self, code: int, reason: str, message: str) -> None:
                self._send(code, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message,
                                  "reason": reason, "code": code})

            def _route(self, method: str):
                url = urllib.parse.urlparse(self.path)
                standin.requests.append((method, url.path))
                return url.path, urllib.parse.parse_qs(url.query)

            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                path, _ = self._route("POST")
                match = JOBS.match(path)
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                key = (match.group(1), body["metadata"]["name"])
                with standin.lock:
                    if key in standin.jobs:
                        return self._status(409, "AlreadyExists", f'pytorchjobs "{key[1]}" already exists')
                    body["metadata"].update(uid=f"uid-{len(standin.jobs)}", resourceVersion="1")
                    standin.jobs[key] = body
                    standin.created_at[key] = time.monotonic()
                    standin.created.append(key)
                self._send(201, body)

            def do_GET(self) -> None:  # noqa: N802
                path, query = self._route("GET")
                if match := JOBS.match(path):
                    return self._get_jobs(match.group(1), match.group(2), query)
                if match := PODS.match(path):
                    return self._get_pods(match.group(1), match.group(2), query)
                self._status(404, "NotFound", path)

            def _get_jobs(self, namespace: str, name: str | None, query: dict) -> None:
                if name is not None:
                    if (namespace, name) not in standin.jobs:
                        return self._status(404, "NotFound", f'pytorchjobs "{name}" not found')
                    return self._send(200, standin.current((namespace, name)))
                selected = query.get("fieldSelector", [""])[0].removeprefix("metadata.name=")
                labels = dict(item.split("=", 1) for item in query.get("labelSelector", [""])[0].split(",") if item)
                keys = [k for k in standin.jobs if k[0] == namespace and (not selected or k[1] == selected)
                        and labels.items() <= standin.jobs[k]["metadata"].get("labels", {}).items()]
                if query.get("watch", ["false"])[0].lower() != "true":  # the client sends "True"
                    return self._send(200, {"kind": "PyTorchJobList", "apiVersion": "kubeflow.org/v1",
                                            "metadata": {"resourceVersion": "1"},
                                            "items": [standin.current(k) for k in keys]})
                self._watch(keys, float(query.get("timeoutSeconds", ["30"])[0]))

            def _watch(self, keys: list, timeout: float) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                deadline, sent = time.monotonic() + timeout, {}
                while time.monotonic() < deadline:
                    for key in keys:
                        job = standin.current(key)
                        if job["status"] != sent.get(key):
                            kind = "ADDED" if key not in sent else "MODIFIED"
                            sent[key] = job["status"]
                            self.wfile.write((json.dumps({"type": kind, "object": job}) + "\n").encode())
                            self.wfile.flush()
                    time.sleep(standin.step_seconds / 4)

            def _get_pods(self, namespace: str, pod: str | None, query: dict) -> None:
                if pod is not None:
                    lines = standin.log_text.splitlines()
                    tail = int(query.get("tailLines", [len(lines)])[0])
                    return self._send(200, "\n".join(lines[-tail:]), "text/plain")
                selector = dict(item.split("=", 1) for item in query.get("labelSelector", [""])[0].split(",") if item)
                job = selector.get("training.kubeflow.org/job-name")
                items = [] if (namespace, job) not in standin.jobs else [{
                    "metadata": {"name": f"{job}-master-0", "namespace": namespace,
                                 "labels": selector}, "spec": {"containers": [{"name": "pytorch"}]}}]
                self._send(200, {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items})

            def do_DELETE(self) -> None:  # noqa: N802
                path, _ = self._route("DELETE")
                match = JOBS.match(path)
                key = (match.group(1), match.group(2))
                if standin.jobs.pop(key, None) is None:
                    return self._status(404, "NotFound", f'pytorchjobs "{key[1]}" not found')
                self._send(200, {"kind": "Status", "apiVersion": "v1", "status": "Success"})

        return Handler
