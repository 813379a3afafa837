"""A stand-in for MLflow as KFP 2.17 ships against it: `kubernetes` auth with workspaces on, on loopback.

KFP 2.17's MLflow integration defaults to `kubernetes` auth with workspaces (kubeflow/pipelines
`backend/src/apiserver/plugins/mlflow/config.go`, `ApplySettingsDefaults`): every call carries the caller's
service-account token as `Authorization: Bearer <token>` and its namespace as `X-MLflow-Workspace`
(`backend/src/common/plugins/mlflow/client.go`, `applyHeaders`; MLflow's own client sends the same in its
`kubernetes-namespaced` mode). A Kubernetes-aware MLflow checks the token (a TokenReview) and that the workspace
is the token's namespace.

`MlflowGateway` does that check in front of a real `mlflow server --enable-workspaces`: a request is refused with
401 without a bearer token equal to the service-account token file's content (read again for each request, as a
projected token is rotated), and with 403 without the workspace header or with another workspace than the token's.
An accepted request goes on to the real server with its workspace header and without the token, so the runs land in
that workspace. `/health` is open, as a probe's is. Each refusal is recorded (`refused`).
"""

from __future__ import annotations

import http.client
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

WORKSPACE_HEADER = "X-MLflow-Workspace"
# Headers a proxy does not pass on (RFC 9110 hop-by-hop), and those it sets itself.
NOT_FORWARDED = {"connection", "keep-alive", "transfer-encoding", "te", "upgrade", "proxy-authorization", "host",
                 "content-length", "authorization"}


class MlflowGateway:
    """Checks the token and the workspace of each request, then forwards it to the MLflow server at `upstream`.

    Args:
        upstream: The real MLflow server (`http://127.0.0.1:<port>`), workspaces enabled.
        token_file: The service-account token file whose content is the one token accepted.
        workspace: The token's namespace: the one workspace its requests may name.
    """

    def __init__(self, upstream: str, token_file: Path, workspace: str) -> None:
        self.upstream = upstream.removeprefix("http://")
        self.token_file = token_file
        self.workspace = workspace
        self.refused: list[dict] = []
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.thread = threading.Thread(target=self.server.serve_forever, name="mlflow-gateway", daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> MlflowGateway:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def refusal(self, headers, path: str) -> tuple[int, str] | None:
        """(HTTP status, reason) when the request may not pass, else None."""
        if path.split("?")[0] == "/health":
            return None
        token = self.token_file.read_text().strip()
        if headers.get("Authorization", "") != f"Bearer {token}":
            return 401, "no valid service-account token"
        workspace = headers.get(WORKSPACE_HEADER, "")
        if not workspace:
            return 403, "no workspace"
        if workspace != self.workspace:
            return 403, f"the token may not use workspace {workspace!r}"
        return None

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        gateway = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _reply(self, status: int, body: bytes, headers: list[tuple[str, str]]) -> None:
                self.send_response(status)
                for name, value in headers:
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _serve(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                refused = gateway.refusal(self.headers, self.path)
                if refused is not None:
                    status, reason = refused
                    gateway.refused.append({"method": self.command, "path": self.path, "reason": reason})
                    code = "UNAUTHENTICATED" if status == 401 else "PERMISSION_DENIED"
                    message = json.dumps({"error_code": code, "message": reason}).encode()
                    return self._reply(status, message, [("Content-Type", "application/json")])
                headers = {name: value for name, value in self.headers.items() if name.lower() not in NOT_FORWARDED}
                connection = http.client.HTTPConnection(gateway.upstream, timeout=60)
                try:
                    connection.request(self.command, self.path, body=body or None, headers=headers)
                    response = connection.getresponse()
                    data = response.read()
                    kept = [(name, value) for name, value in response.getheaders()
                            if name.lower() not in NOT_FORWARDED]
                finally:
                    connection.close()
                self._reply(response.status, data, kept)

            do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = _serve  # noqa: N815 - http.server's naming

        return Handler
