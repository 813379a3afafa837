"""The client of the sandbox service (`python -m trainer.sandbox.server`): the same contract over HTTP.

Requests (JSON; docs/sandbox.md, "The remote service"):
- `POST /v1/run` `{"code": str, "limits": {SandboxLimits fields}}` -> the SandboxResult fields;
- `GET /v1/limits` -> `{"max_limits": {SandboxLimits fields}}`, the most the service allows;
- `GET /healthz` -> `{"status": "ok"}`, without a token (for the kubelet's probes).
Every other request needs `Authorization: Bearer <token>`. The requests go through `trainer.http`'s
JsonClient, which holds the token: it is never part of a message, a log line or the object's repr.

Retries. `GET /v1/limits` only reads, so every transient failure is retried. A run is retried only
when the failure proves the service never took it (`is_unprocessed`): the connection was refused (a
restarting pod), or the answer is 408, 429, 502, 503 or 504 (a proxy without a backend, or the
service's own 503 when the sandbox could not start). A reset, a timeout or an answer cut short may
come after the program ran, and is not retried: a second run would double the step's wait (up to
`wall_seconds`) for a program whose first run may have finished. A 504 may also follow a run; a
replay is bearable there, since a run leaves nothing behind (its scratch folder and processes go with it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields

from trainer.http.client import BearerToken, JsonClient
from trainer.http.errors import ServiceError
from trainer.http.retry import RetryPolicy
from trainer.http.transient import is_transient, is_unprocessed
from trainer.sandbox.contract import SandboxError, SandboxLimits, SandboxResult, SandboxUnavailableError

NETWORK_MARGIN_SECONDS = 30  # beyond a run's wall_seconds: the service's own start-up and the network
# About 7.5 s of waits (0.5, 1, 2, 4): a service pod that restarts within that is ridden out.
MAX_RETRIES = 4
BACKOFF_SECONDS = 0.5
MAX_BACKOFF_SECONDS = 4.0


class RemoteSandbox:
    """Runs programs on the sandbox service at `url` (e.g. `http://af-alignflow-sandbox.ml.svc:8080`).

    Args:
        url: The service's base URL.
        token: Its bearer token.
        max_retries: Retries of a failed request that may be retried (see the module docstring).
        backoff_seconds: The wait before the first retry, doubled before each next one up to MAX_BACKOFF_SECONDS.
    """

    def __init__(self, url: str, token: str, *, max_retries: int = MAX_RETRIES,
                 backoff_seconds: float = BACKOFF_SECONDS):
        if not token:
            raise SandboxUnavailableError(f"sandbox service {url}: no token (the variable that should hold it is "
                                          "empty or unset)")
        self.url = url.rstrip("/")
        self.max_retries, self.backoff_seconds = max_retries, backoff_seconds
        self._client = JsonClient("sandbox service", token=BearerToken(token))

    def __repr__(self) -> str:
        return f"RemoteSandbox(url={self.url!r})"

    def run_python(self, code: str, *, limits: SandboxLimits | None = None) -> SandboxResult:
        """Run `code` on the service; the same contract as `trainer.sandbox.run_python`.

        Raises:
            SandboxError: The service refused the request or could not be reached; the message says which.
        """
        limits = limits or SandboxLimits()
        body = {"code": code, "limits": limits.model_dump()}
        answer = self._request("POST", "/v1/run", body, timeout=limits.wall_seconds + NETWORK_MARGIN_SECONDS,
                               retry_if=is_unprocessed)
        return SandboxResult(**{field.name: answer[field.name] for field in fields(SandboxResult) if field.name in answer})

    def check(self, limits: SandboxLimits | None = None) -> None:
        """Check at start-up that the service answers, takes the token and allows `limits`.

        Raises:
            SandboxUnavailableError: It does not, with the reason.
        """
        try:
            allowed = self._request("GET", "/v1/limits", None, timeout=NETWORK_MARGIN_SECONDS,
                                    retry_if=is_transient)["max_limits"]
        except SandboxError as err:
            raise SandboxUnavailableError(str(err)) from err
        for name, value in (limits or SandboxLimits()).model_dump().items():
            if value > allowed[name]:
                raise SandboxUnavailableError(f"sandbox service {self.url}: limits.{name} is {value}, the service "
                                              f"allows at most {allowed[name]}")

    def _request(self, method: str, path: str, body: dict | None, *, timeout: float,
                 retry_if: Callable[[BaseException], bool]) -> dict:
        retry = RetryPolicy(self.max_retries, self.backoff_seconds, MAX_BACKOFF_SECONDS, retry_if=retry_if,
                            api="the sandbox service")
        try:
            return self._client.request(method, self.url + path, body, retry=retry, timeout=timeout)
        except ServiceError as err:
            raise SandboxError(str(err)) from err
