"""The client of the sandbox service (`python -m trainer.agents.sandbox.server`): the same contract over HTTP.

Requests (JSON; docs/sandbox.md, "The remote service"):
- `POST /v1/run` `{"code": str, "limits": {SandboxLimits fields}}` -> the SandboxResult fields;
- `GET /v1/limits` -> `{"max_limits": {SandboxLimits fields}}`, the most the service allows;
- `GET /healthz` -> `{"status": "ok"}`, without a token (for the kubelet's probes).
Every other request needs `Authorization: Bearer <token>`. The token is held by the client only; it is
never part of a message, a log line or the object's repr.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import fields

from trainer.agents.sandbox.contract import SandboxError, SandboxLimits, SandboxResult, SandboxUnavailableError

NETWORK_MARGIN_SECONDS = 30  # beyond a run's wall_seconds: the service's own start-up and the network


class RemoteSandbox:
    """Runs programs on the sandbox service at `url` (e.g. `http://af-alignflow-sandbox.ml.svc:8080`)."""

    def __init__(self, url: str, token: str):
        if not token:
            raise SandboxUnavailableError(f"sandbox service {url}: no token (the variable that should hold it is "
                                          "empty or unset)")
        self.url, self._token = url.rstrip("/"), token

    def __repr__(self) -> str:
        return f"RemoteSandbox(url={self.url!r})"

    def run_python(self, code: str, *, limits: SandboxLimits | None = None) -> SandboxResult:
        """Run `code` on the service; the same contract as `trainer.agents.sandbox.run_python`.

        Raises:
            SandboxError: The service refused the request or could not be reached; the message says which.
        """
        limits = limits or SandboxLimits()
        body = {"code": code, "limits": limits.model_dump()}
        answer = self._request("POST", "/v1/run", body, timeout=limits.wall_seconds + NETWORK_MARGIN_SECONDS)
        return SandboxResult(**{field.name: answer[field.name] for field in fields(SandboxResult) if field.name in answer})

    def check(self, limits: SandboxLimits | None = None) -> None:
        """Check at start-up that the service answers, takes the token and allows `limits`.

        Raises:
            SandboxUnavailableError: It does not, with the reason.
        """
        try:
            allowed = self._request("GET", "/v1/limits", None, timeout=NETWORK_MARGIN_SECONDS)["max_limits"]
        except SandboxError as err:
            raise SandboxUnavailableError(str(err)) from err
        for name, value in (limits or SandboxLimits()).model_dump().items():
            if value > allowed[name]:
                raise SandboxUnavailableError(f"sandbox service {self.url}: limits.{name} is {value}, the service "
                                              f"allows at most {allowed[name]}")

    def _request(self, method: str, path: str, body: dict | None, *, timeout: float) -> dict:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method, headers={
            "Authorization": f"Bearer {self._token}", "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as err:
            raise SandboxError(f"sandbox service {self.url}{path}: HTTP {err.code}: {_error_text(err)}") from err
        except (urllib.error.URLError, TimeoutError, ConnectionError) as err:
            reason = getattr(err, "reason", err)
            raise SandboxError(f"sandbox service {self.url}{path} unreachable: {reason}") from err


def _error_text(err: urllib.error.HTTPError) -> str:
    try:
        return json.loads(err.read())["error"]
    except (ValueError, KeyError, TypeError, OSError):
        return err.reason
