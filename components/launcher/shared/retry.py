"""Retrying HTTP API calls through transient failures, with exponential backoff: the one definition of
"transient" for the launcher (the Kubernetes API) and the `alignflow` CLI (the KFP API, pipelines/remote.py).

Transient: HTTP 408, 429 (honouring Retry-After), 500, 502, 503, 504; status 0, which the generated
API clients (kubernetes, kfp_server_api) report when TLS fails under them; and the connection
failing under the client (reset, refused, read timeout: urllib3's errors and OSError). Everything
else (403, 404, 409, 422, ...) is an answer and goes to the caller at once. A run of consecutive
failures longer than `max_retries`, or a wait that would pass the `deadline`, becomes the policy's
`unavailable` error (`ApiUnavailable`, a LaunchError, by default); a success resets the count.

What this module leaves out: what a failure means for the job. The launcher decides that (an
unreachable API server never deletes a running job); the CLI never retries creating a run.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

from trainer.errors import AlignflowError, LaunchError

logger = logging.getLogger(__name__)
TRANSIENT_STATUSES = frozenset({0, 408, 429, 500, 502, 503, 504})
T = TypeVar("T")


class ApiUnavailable(LaunchError):
    """The API server kept failing for longer than the retry budget."""


def is_transient(err: BaseException) -> bool:
    """Whether `err` is worth retrying: an API answer with a transient HTTP status (any client's exception
    with an integer `status`), or a failed connection."""
    from urllib3.exceptions import HTTPError

    status = getattr(err, "status", None)
    if isinstance(status, int) and not isinstance(status, bool):
        return status in TRANSIENT_STATUSES
    return isinstance(err, (HTTPError, OSError))


def describe(err: BaseException) -> str:
    """A one-line account of an API failure."""
    status = getattr(err, "status", None)
    if status:
        return f"HTTP {status} {getattr(err, 'reason', '') or ''}".strip()
    return f"{type(err).__name__}: {err}".splitlines()[0][:200]


def _retry_after(err: BaseException) -> float:
    headers = getattr(err, "headers", None) or {}
    try:
        return float(headers.get("Retry-After", 0))
    except (TypeError, ValueError):
        return 0.0


class RetryPolicy:
    """Backoff state for one sequence of calls: `base * 2**(n-1)` seconds, capped, at most `max_retries` in a row.

    Args:
        max_retries: Consecutive transient failures tolerated; one more raises ApiUnavailable.
        base_seconds: The first wait.
        max_seconds: The longest wait (also caps a server's Retry-After).
        sleep: How to wait (tests pass a recorder).
        deadline: A `time.monotonic()` value no wait may pass; None: none.
        api: How messages name the API.
        unavailable: The error raised past the budget or the deadline.
    """

    def __init__(self, max_retries: int = 8, base_seconds: float = 1.0, max_seconds: float = 30.0,
                 sleep: Callable[[float], None] = time.sleep, *, deadline: float | None = None,
                 api: str = "the Kubernetes API", unavailable: type[AlignflowError] = ApiUnavailable) -> None:
        self.max_retries = max_retries
        self.base_seconds = base_seconds
        self.max_seconds = max_seconds
        self.sleep = sleep
        self.deadline = deadline
        self.api = api
        self.unavailable = unavailable
        self.failures = 0

    def succeeded(self) -> None:
        self.failures = 0

    def failed(self, err: BaseException, what: str) -> None:
        """Count a transient failure of `what` and wait before the next try; ApiUnavailable past the budget."""
        self.failures += 1
        if self.failures > self.max_retries:
            raise self.unavailable(f"{what}: {self.api} kept failing ({describe(err)}) after "
                                   f"{self.max_retries} retries") from err
        delay = min(self.max_seconds, max(self.base_seconds * 2 ** (self.failures - 1), _retry_after(err)))
        if self.deadline is not None and time.monotonic() + delay > self.deadline:
            raise self.unavailable(f"{what}: {self.api} kept failing ({describe(err)}) until the deadline") from err
        logger.warning("%s: %s; retry %d of %d in %.1f s", what, describe(err), self.failures, self.max_retries,
                       delay)
        self.sleep(delay)

    def call(self, function: Callable[..., T], what: str, *args: Any, **kwargs: Any) -> T:
        """`function(*args, **kwargs)`, retried through transient failures."""
        while True:
            try:
                result = function(*args, **kwargs)
            except Exception as err:
                if not is_transient(err):
                    raise
                self.failed(err, what)
                continue
            self.succeeded()
            return result
