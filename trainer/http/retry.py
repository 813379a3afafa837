"""Retrying calls through transient failures with exponential backoff, a budget and a deadline.

The waits are `base_seconds * 2**(n-1)` before retry n, capped at `max_seconds`, longer when the
answer's `Retry-After` asks for more (capped alike), and stretched by a random share up to `jitter`
so that many clients do not retry in step. A run of consecutive failures longer than `max_retries`,
or a wait that would pass the `deadline`, becomes the policy's `unavailable` error; a success resets
the count. Which failures are retried is `retry_if`'s call: `is_transient` unless told otherwise.

Users: the launcher (the Kubernetes API) and the `alignflow` CLI (the KFP API) through `call` and
`failed`; the JSON client through `call`; the reward service client takes only `next_wait`, as its
requests share one fate per scoring call (`trainer/rewards/service_client.py`).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import Any, TypeVar

from trainer.errors import AlignflowError
from trainer.http.errors import ServiceUnavailableError
from trainer.http.transient import describe, is_transient, retry_after_seconds

logger = logging.getLogger(__name__)
T = TypeVar("T")
MAX_DOUBLINGS = 60  # past this the cap has long applied; it keeps 2**n from overflowing a float


class RetryPolicy:
    """Backoff state for one sequence of calls (see the module docstring).

    Args:
        max_retries: Consecutive transient failures tolerated; one more raises `unavailable`.
        base_seconds: The first wait.
        max_seconds: The longest wait before jitter (it also caps a server's Retry-After).
        sleep: How to wait (tests pass a recorder).
        deadline: A `time.monotonic()` value no wait may pass; None: none.
        jitter: Each wait is stretched by a random share up to this (0.25: up to 25% longer); 0: none.
        retry_if: Which failures are retried; others go to the caller at once.
        api: How messages name the API; default the class's `api`.
        unavailable: The error raised past the budget or the deadline; default the class's `unavailable`.
    """

    api = "the service"
    unavailable: type[AlignflowError] = ServiceUnavailableError

    def __init__(self, max_retries: int = 8, base_seconds: float = 1.0, max_seconds: float = 30.0,
                 sleep: Callable[[float], Any] = time.sleep, *, deadline: float | None = None, jitter: float = 0.0,
                 retry_if: Callable[[BaseException], bool] = is_transient, api: str | None = None,
                 unavailable: type[AlignflowError] | None = None) -> None:
        self.max_retries = max_retries
        self.base_seconds = base_seconds
        self.max_seconds = max_seconds
        self.sleep = sleep
        self.deadline = deadline
        self.jitter = jitter
        self.retry_if = retry_if
        self.api = api or self.api
        self.unavailable = unavailable or self.unavailable
        self.failures = 0
        self._random = random.Random()  # a private generator leaves the run's seeded streams alone

    def waits(self) -> list[float]:
        """The wait before each retry, in order, when no answer asks for longer; without jitter."""
        return [self._backoff(retry) for retry in range(1, self.max_retries + 1)]

    def succeeded(self) -> None:
        self.failures = 0

    def next_wait(self, err: BaseException) -> float | None:
        """Count a transient failure; the seconds to wait before the next try, or None once the budget or the
        deadline is spent."""
        self.failures += 1
        if self.failures > self.max_retries:
            return None
        delay = max(self._backoff(self.failures), min(self.max_seconds, retry_after_seconds(err)))
        delay *= 1 + self.jitter * self._random.random()
        if self.deadline is not None and time.monotonic() + delay > self.deadline:
            return None
        return delay

    def failed(self, err: BaseException, what: str) -> None:
        """Count a transient failure of `what` and wait before the next try; `unavailable` past the budget."""
        delay = self.next_wait(err)
        if delay is None:
            why = f"after {self.max_retries} retries" if self.failures > self.max_retries else "until the deadline"
            raise self.unavailable(f"{what}: {self.api} kept failing ({describe(err)}) {why}") from err
        logger.warning("%s: %s; retry %d of %d in %.1f s", what, describe(err), self.failures, self.max_retries,
                       delay)
        self.sleep(delay)

    def call(self, function: Callable[..., T], what: str, *args: Any, **kwargs: Any) -> T:
        """`function(*args, **kwargs)`, retried through the failures `retry_if` accepts."""
        while True:
            try:
                result = function(*args, **kwargs)
            except Exception as err:
                if not self.retry_if(err):
                    raise
                self.failed(err, what)
                continue
            self.succeeded()
            return result

    def _backoff(self, retry: int) -> float:
        return min(self.max_seconds, self.base_seconds * 2 ** min(retry - 1, MAX_DOUBLINGS))
