"""Kubeflow Trainer's status server (KEP-2779, feature gate `TrainJobStatus`), emulated: how a TrainJob shows progress.

What Trainer v2.2+ does where the gate is on (kubeflow/trainer `pkg/statusserver/`, and the `TrainJobStatus` plugin
in `pkg/runtime/framework/plugins/trainjobstatus/`):
- every trainer container gets `KUBEFLOW_TRAINER_SERVER_URL` (`https://<controller>/apis/trainer.kubeflow.org/
  v1alpha1/namespaces/<ns>/trainjobs/<name>/status`), `KUBEFLOW_TRAINER_SERVER_CA_CERT` and
  `KUBEFLOW_TRAINER_SERVER_TOKEN` (files of a projected volume at /var/run/secrets/kubeflow/trainer: a
  service-account token of audience `trainer.kubeflow.org/v1alpha1/namespaces/<ns>/trainjobs/<name>/status`, and
  `ca.crt` from the ConfigMap `<name>-tls-config` the controller writes): `inject`;
- the server takes `POST` of `{"trainerStatus": {...}}` with that token as a bearer token, verifies the token
  (OIDC against the cluster's service-account issuer: signature, expiry; here: the tokens this server issued for
  the kubelet's projected volumes), its audience, and that it was issued in the TrainJob's namespace (`auth.go`
  at 8c0f5059; it does not check which pod holds it), then writes `status.trainerStatus` (server-side apply of the status
  subresource; here: the store, after the CRD's schema). Answers: 200 with the request echoed, 403, 404, 422.

Every request is recorded (`requests`), so a test can see how often a job reported.
"""

from __future__ import annotations

import json
import re
import secrets
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.cluster.store import NotFound, Store

MOUNT_PATH = "/var/run/secrets/kubeflow/trainer"
VOLUME = "kubeflow-trainer-token"
PATH = re.compile(r"^/apis/trainer\.kubeflow\.org/v1alpha1/namespaces/(?P<ns>[^/]+)/trainjobs/(?P<name>[^/]+)/status$")
MAX_BODY = 1 << 16  # the server's body limit


def audience(namespace: str, name: str) -> str:
    return f"trainer.kubeflow.org/v1alpha1/namespaces/{namespace}/trainjobs/{name}/status"


@dataclass(frozen=True)
class StatusRequest:
    namespace: str
    name: str
    code: int


class TrainerStatusServer:
    """The status endpoint of one emulated Kubeflow Trainer controller (see the module docstring)."""

    def __init__(self, store: Store, ssl_context: Any, ca_pem: bytes) -> None:
        self.store = store
        self.ca_pem = ca_pem
        self.tokens: dict[str, tuple[str, str, str]] = {}  # token -> (namespace, pod, audience)
        self.requests: list[StatusRequest] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.socket = ssl_context.wrap_socket(self._server.socket, server_side=True)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True, name="trainer-status")

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def url(self, namespace: str, name: str) -> str:
        return f"https://127.0.0.1:{self._server.server_address[1]}/apis/{audience(namespace, name)}"

    def issue(self, namespace: str, pod: str, token_audience: str) -> str:
        """A projected token for `pod` (what the kubelet asks the API server for, TokenRequest)."""
        token = secrets.token_hex(16)
        with self._lock:
            self.tokens[token] = (namespace, pod, token_audience)
        return token

    # ---- the TrainJobStatus plugin

    def inject(self, job: dict, pod_spec: dict) -> None:
        """Give the trainer containers of a TrainJob's pod the endpoint, its CA and the token (the plugin's
        EnforcePodSpec), and write the CA ConfigMap the projected volume reads (its Build)."""
        namespace, name = job["metadata"]["namespace"], job["metadata"]["name"]
        config_map = f"{name}-tls-config"
        try:
            self.store.get("configmaps", namespace, config_map)
        except NotFound:
            self.store.create("configmaps", {"metadata": {"name": config_map, "namespace": namespace},
                                             "data": {"ca.crt": self.ca_pem.decode()}})
        env = [{"name": "KUBEFLOW_TRAINER_SERVER_URL", "value": self.url(namespace, name)},
               {"name": "KUBEFLOW_TRAINER_SERVER_CA_CERT", "value": f"{MOUNT_PATH}/ca.crt"},
               {"name": "KUBEFLOW_TRAINER_SERVER_TOKEN", "value": f"{MOUNT_PATH}/token"}]
        for container in pod_spec["containers"]:
            names = {item["name"] for item in env}
            container["env"] = [e for e in container.get("env") or [] if e["name"] not in names] + env
            container["volumeMounts"] = [*(container.get("volumeMounts") or []),
                                         {"name": VOLUME, "mountPath": MOUNT_PATH, "readOnly": True}]
        pod_spec["volumes"] = [*(pod_spec.get("volumes") or []), {"name": VOLUME, "projected": {"sources": [
            {"serviceAccountToken": {"audience": audience(namespace, name), "expirationSeconds": 3600,
                                     "path": "token"}},
            {"configMap": {"name": config_map, "items": [{"key": "ca.crt", "path": "ca.crt"}]}}]}}]

    # ---- the endpoint

    def authorized(self, header: str, namespace: str, name: str) -> bool:
        """The bearer token is one this server issued, for this TrainJob's audience, in its namespace."""
        token = header.removeprefix("Bearer ").strip() if header.startswith("Bearer ") else ""
        with self._lock:
            issued = self.tokens.get(token)
        return issued is not None and issued[0] == namespace and issued[2] == audience(namespace, name)

    def apply(self, namespace: str, name: str, body: dict) -> tuple[int, dict]:
        """Write `body["trainerStatus"]` into the TrainJob's status; (HTTP code, answer)."""
        from tests.schemas import problems

        status = body.get("trainerStatus")
        if status is None:
            return 200, body
        found = problems("trainjobs.trainer.kubeflow.org", {"status": {"trainerStatus": status}}, "trainer-v2.4")
        if not isinstance(status, dict) or "lastUpdatedTime" not in status:
            found.append("status.trainerStatus: Invalid value: lastUpdatedTime is required when trainerStatus is "
                         "present")
        if found:
            return 422, _failure(422, "Invalid", "; ".join(found))
        updated = self.store.mutate("trainjobs", namespace, name,
                                    lambda job: job.setdefault("status", {}).update(trainerStatus=status))
        if updated is None:
            return 404, _failure(404, "NotFound", "Train job not found")
        return 200, body

    def record(self, namespace: str, name: str, code: int) -> None:
        with self._lock:
            self.requests.append(StatusRequest(namespace, name, code))


def _failure(code: int, reason: str, message: str) -> dict:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message, "reason": reason,
            "code": code}


def _handler(server: TrainerStatusServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def _answer(self, code: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self) -> None:  # noqa: N802 - http.server's naming
            match = PATH.match(self.path)
            if match is None:
                self._answer(404, _failure(404, "NotFound", "Not found"))
                return
            namespace, name = match["ns"], match["name"]
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(min(length, MAX_BODY + 1))
            if not server.authorized(self.headers.get("Authorization", ""), namespace, name):
                code, answer = 403, _failure(403, "Forbidden", "Forbidden")
            elif len(raw) > MAX_BODY:
                code, answer = 413, _failure(413, "RequestEntityTooLarge", "Request body too large")
            else:
                try:
                    code, answer = server.apply(namespace, name, json.loads(raw))
                except (ValueError, AttributeError):
                    code, answer = 422, _failure(422, "Invalid", "Invalid payload")
            server.record(namespace, name, code)
            self._answer(code, answer)

        def do_GET(self) -> None:  # noqa: N802
            self._answer(404, _failure(404, "NotFound", "Not found"))

    return Handler
