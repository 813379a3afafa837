"""The HTTP client every remote reward source uses: JSON POSTs with a timeout, retries, a concurrency limit, a token.

Built on `trainer.http`: one request is a `JsonClient.send` (the token, the timeout, one-line errors
naming the service and its URL), what is retried is what `is_transient` calls transient, and the
waits are a `RetryPolicy`'s. What this module adds is the failure rule of one scoring call.

Failure rule. A request that cannot connect, breaks off (a reset, an answer cut short, a status
line that is not HTTP), times out, or gets HTTP 408, 429, 500, 502, 503 or 504 is retried
`max_retries` times, waiting `backoff_seconds` doubled per retry and capped at
`max_backoff_seconds` (longer when the service asks so with Retry-After, within the same cap), plus
up to 25% jitter so that clients do not retry in step. After the last try it is a
`ServiceUnavailable`, one line naming the service and its URL. The requests of one scoring call
share their fate: once one has failed for good the others stop (no new tries, waits cut short)
and end with that same failure, so a dead service fails a step in about one retry budget rather
than one per request. Any other HTTP error, or an answer that is not JSON, is a `RewardError` at
once: retrying a request the service refuses changes nothing.

`check_reachable` asks each service once when the stage starts, before the model loads, so a
wrong host or port stops the run in seconds rather than at the first scoring.

The bearer token is read from the environment variable `token_env` or the file `token_file` (a
Kubernetes Secret, as env or as a mounted volume) when the client is built, and handed to the
`JsonClient`, which sends it only in the Authorization header and blanks it out of every message
(an error body that quotes the header included); never put into a repr or a log.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from trainer.config.rewards import ServiceConfig
from trainer.errors import ConfigError, RewardError
from trainer.http.client import BearerToken, JsonClient
from trainer.http.errors import ServiceCallError, ServiceError
from trainer.http.retry import RetryPolicy
from trainer.http.transient import is_transient

logger = logging.getLogger(__name__)
# Answers to the start-up probe that mean "nothing is serving yet" (a proxy or ingress without a backend).
NOT_READY_STATUSES = frozenset({502, 503, 504})
JITTER = 0.25  # each wait is stretched by a random 0-25%
PROBE_TIMEOUT_SECONDS = 5.0


class ServiceUnavailable(RewardError):
    """A reward service stayed unreachable (or overloaded, or broke off) through every retry."""


def read_token(options: ServiceConfig, key: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The bearer token `options` points at, or None; ConfigError (naming `key`, never the value) if it is missing."""
    environ = os.environ if environ is None else environ
    if options.token_env is not None:
        token = environ.get(options.token_env, "").strip()
        if not token:
            raise ConfigError(f"{key}.token_env names {options.token_env}, which is not set or empty")
        return token
    if options.token_file is not None:
        try:
            token = Path(options.token_file).read_text().strip()
        except OSError as err:
            raise ConfigError(f"{key}.token_file: cannot read {options.token_file}: {err.strerror}") from err
        if not token:
            raise ConfigError(f"{key}.token_file: {options.token_file} is empty")
        return token
    return None


def retry_policy(options: ServiceConfig, sleep: Callable[[float], Any] = time.sleep) -> RetryPolicy:
    """The waits of one request to the service `options` describes (`.waits()`: the schedule without jitter)."""
    return RetryPolicy(options.max_retries, options.backoff_seconds, options.max_backoff_seconds, sleep, jitter=JITTER)


class RequestGroup:
    """What the requests of one scoring call share: the first failure for good, and whether a retry was logged."""

    def __init__(self) -> None:
        self.failure: ServiceUnavailable | None = None
        self.failed = threading.Event()
        self.lock = threading.Lock()
        self.has_logged_retry = False

    def fail(self, err: ServiceUnavailable) -> ServiceUnavailable:
        """Record `err` unless another request failed first; the failure the whole group ends with."""
        with self.lock:
            if self.failure is None:
                self.failure = err
                self.failed.set()
            return self.failure

    def log_retry(self, message: str) -> None:
        """The group's first retry is a warning; the rest, which say the same, are debug lines."""
        with self.lock:
            level = logging.DEBUG if self.has_logged_retry else logging.WARNING
            self.has_logged_retry = True
        logger.log(level, "%s", message)


class ServiceClient:
    """POSTs JSON to one service with the configured timeout, retries, concurrency and token.

    Args:
        name: The reward source's name, for messages.
        options: The source's `service` section.
        key: Its dotted config key (`reward.sources.2.service`), for messages.
        environ: Where `token_env` is looked up; default `os.environ`.
    """

    def __init__(self, name: str, options: ServiceConfig, key: str, environ: Mapping[str, str] | None = None) -> None:
        self.name = name
        self.options = options
        self.key = key
        token = read_token(options, key, environ)
        self.http = JsonClient(f"reward service {name}", token=None if token is None else BearerToken(token),
                               timeout_seconds=options.timeout_seconds)

    def __repr__(self) -> str:  # the token stays out of every repr (and so of tracebacks' locals printers)
        return f"ServiceClient({self.name!r}, {self.options.url!r})"

    def blank(self, text: str) -> str:
        """`text` with this client's token masked: every message built from what a service sent passes here."""
        return self.http.blank(text)

    def post(self, url: str, body: Any) -> Any:
        """The JSON answer to one POST of `body`, retried as the module docstring says; ServiceUnavailable if none."""
        answer = self._post(url, body, RequestGroup())
        if isinstance(answer, ServiceUnavailable):
            raise answer
        return answer

    def post_all(self, url: str, bodies: list[Any]) -> list[Any]:
        """`post` of each body, at most `max_concurrency` at once; each result is the answer or the
        `ServiceUnavailable` the group ended with (other errors are raised)."""
        group = RequestGroup()

        def one(body: Any) -> Any:
            try:
                return self._post(url, body, group)
            except RewardError as err:  # a refused request or a bad answer: the others need not go on either
                group.fail(ServiceUnavailable(f"not sent: {err}"))
                raise

        if len(bodies) == 1:
            return [one(bodies[0])]
        with ThreadPoolExecutor(max_workers=min(self.options.max_concurrency, len(bodies)),
                                thread_name_prefix=f"reward-{self.name}") as pool:
            return list(pool.map(one, bodies))

    def check_reachable(self) -> None:
        """Return once an HTTP server answers a GET of the service's URL (any status but 502-504: the route
        may take only POST), retried on the usual schedule; RewardError naming the key and URL otherwise."""
        failure = self._with_retries(self._probe, RequestGroup())
        if isinstance(failure, ServiceUnavailable):
            raise RewardError(f"{self.key}.url: {failure}; checked when the stage starts, before the model loads")

    def _post(self, url: str, body: Any, group: RequestGroup) -> Any:
        return self._with_retries(lambda: self.http.send("POST", url, body), group)

    def _with_retries(self, attempt: Callable[[], Any], group: RequestGroup) -> Any:
        """What `attempt` returns once it succeeds, or the group's failure for good; RewardError at once for a
        failure that is not transient."""
        policy = retry_policy(self.options, sleep=group.failed.wait)  # a wait ends early if the group fails meanwhile
        waits = policy.waits()
        for tries in itertools.count(1):
            if group.failure is not None:  # another request of the group has failed for good
                return group.failure
            try:
                return attempt()
            except ServiceError as err:  # its message names the service and the URL, the token masked
                if not is_transient(err):
                    raise RewardError(str(err)) from None
                wait = policy.next_wait(err)
                if wait is None:
                    return group.fail(ServiceUnavailable(f"{err} (after {tries} tries over {sum(waits):.1f} s "
                                                         f"of waits)"))
                group.log_retry(f"{err}; retrying in {wait:.2f} s (try {tries + 1} of {len(waits) + 1})")
                policy.sleep(wait)

    def _probe(self) -> None:
        """Return once an HTTP server answers at the URL, with anything but 502-504; ServiceCallError otherwise."""
        url = self.options.url
        status = self.http.status_of(url, timeout=min(self.options.timeout_seconds, PROBE_TIMEOUT_SECONDS))
        if status in NOT_READY_STATUSES:
            raise ServiceCallError(f"{self.http.service} ({url}) answered HTTP {status}", url=url, status=status,
                                   reason="")
