"""The HTTP client every remote reward source uses: JSON POSTs with a timeout, retries, a concurrency limit, a token.

Standard library only (`urllib`): a reward service and an OpenAI-compatible judge both take one JSON
POST and answer JSON, which needs no client package.

Failure rule. A request that cannot connect, breaks off (a reset, an answer cut short, a status
line that is not HTTP), times out, or gets HTTP 408, 429 or 5xx is retried `max_retries` times,
waiting `ServiceConfig.retry_waits()` (backoff doubled per retry, capped at `max_backoff_seconds`,
plus up to 25% jitter so that clients do not retry in step). After the last try it is a
`ServiceUnavailable`, one line naming the service and its URL. The requests of one scoring call
share their fate: once one has failed for good the others stop (no new tries, waits cut short)
and end with that same failure, so a dead service fails a step in about one retry budget rather
than one per request. Any other HTTP error, or an answer that is not JSON, is a `RewardError` at
once: retrying a request the service refuses changes nothing.

`check_reachable` asks each service once when the stage starts, before the model loads, so a
wrong host or port stops the run in seconds rather than at the first scoring.

The bearer token is read from the environment variable `token_env` or the file `token_file` (a
Kubernetes Secret, as env or as a mounted volume) when the client is built, kept in a private
attribute, sent only in the Authorization header, and blanked out of every message this client
builds (an error body that quotes the header included); never put into a repr or a log.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import random
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from trainer.config.rewards import ServiceConfig
from trainer.errors import ConfigError, RewardError
from trainer.redact import mask_secrets

logger = logging.getLogger(__name__)
RETRIED_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
# Answers to the start-up probe that mean "nothing is serving yet" (a proxy or ingress without a backend).
NOT_READY_STATUSES = frozenset({502, 503, 504})
JITTER = 0.25  # each wait is stretched by a random 0-25%
PROBE_TIMEOUT_SECONDS = 5.0
MAX_ERROR_BODY_BYTES = 64 * 1024  # read (and blanked) before the message keeps its first 200 characters


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


def one_line(text: str) -> str:
    """`text` with each run of whitespace (newlines included) as one space: a message stays one line."""
    return " ".join(text.split())


def describe_transport_error(err: BaseException) -> str:
    """`ConnectionRefusedError: [Errno 111] Connection refused` for a failure below HTTP, unwrapping urllib's."""
    reason = err.reason if isinstance(err, urllib.error.URLError) else err
    text = f"{type(reason).__name__}: {reason}" if isinstance(reason, BaseException) else str(reason)
    return one_line(text)  # BadStatusLine's text is the line received, CRLF included


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
        self._token = read_token(options, key, environ)
        self._random = random.Random()  # jitter; a private generator leaves the run's seeded streams alone

    def __repr__(self) -> str:  # the token stays out of every repr (and so of tracebacks' locals printers)
        return f"ServiceClient({self.name!r}, {self.options.url!r})"

    def blank(self, text: str) -> str:
        """`text` with this client's token masked: every message built from what a service sent passes here."""
        return mask_secrets(text, [self._token] if self._token else [])

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
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self._token is not None:
            headers["Authorization"] = f"Bearer {self._token}"
        request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers, method="POST")
        return self._with_retries(lambda: self._send(request), group)

    def _with_retries(self, attempt: Callable[[], Any], group: RequestGroup) -> Any:
        """What `attempt` returns once it raises no ServiceUnavailable, or the group's failure for good."""
        waits = self.options.retry_waits()
        for tries, wait in enumerate([*waits, None], start=1):
            if group.failure is not None:  # another request of the group has failed for good
                return group.failure
            try:
                return attempt()
            except ServiceUnavailable as err:
                if wait is None:
                    return group.fail(ServiceUnavailable(f"{err} (after {tries} tries over {sum(waits):.1f} s "
                                                         f"of waits)"))
                wait *= 1 + JITTER * self._random.random()
                group.log_retry(f"{err}; retrying in {wait:.2f} s (try {tries + 1} of {len(waits) + 1})")
                group.failed.wait(wait)  # returns early if another request fails for good meanwhile
        raise AssertionError("unreachable")

    def _send(self, request: urllib.request.Request) -> Any:
        where = f"reward service {self.name} ({request.full_url})"
        try:
            with urllib.request.urlopen(request, timeout=self.options.timeout_seconds) as response:
                raw = response.read()
        except urllib.error.HTTPError as err:
            if err.code in RETRIED_STATUSES:
                raise ServiceUnavailable(f"{where} answered HTTP {err.code}") from None
            detail = one_line(self.blank(self._error_body(err)))[:200]
            raise RewardError(self.blank(f"{where} answered HTTP {err.code} {err.reason}: {detail}")) from None
        except (http.client.InvalidURL, ValueError) as err:  # the config check lets none through; kept to one line
            raise RewardError(f"{where}: the URL cannot be used ({err})") from None
        except (http.client.HTTPException, OSError) as err:  # refused, reset, cut short, not HTTP, timed out
            raise ServiceUnavailable(self.blank(f"{where} is unreachable or broke off: "
                                                f"{describe_transport_error(err)}")) from None
        try:
            return json.loads(raw)
        except ValueError:
            raise RewardError(self.blank(f"{where} answered something that is not JSON: {raw[:80]!r}")) from None

    def _probe(self) -> None:
        where = f"reward service {self.name} ({self.options.url})"
        request = urllib.request.Request(self.options.url, method="GET")  # no token: the probe needs none
        try:
            with urllib.request.urlopen(request, timeout=min(self.options.timeout_seconds, PROBE_TIMEOUT_SECONDS)):
                return
        except urllib.error.HTTPError as err:
            if err.code in NOT_READY_STATUSES:
                raise ServiceUnavailable(f"{where} answered HTTP {err.code}") from None
        except (http.client.InvalidURL, ValueError) as err:
            raise RewardError(f"{where}: the URL cannot be used ({err})") from None
        except (http.client.HTTPException, OSError) as err:
            raise ServiceUnavailable(f"{where} is unreachable: {describe_transport_error(err)}") from None

    @staticmethod
    def _error_body(err: urllib.error.HTTPError) -> str:
        try:
            return err.read(MAX_ERROR_BODY_BYTES).decode(errors="replace")
        except (http.client.HTTPException, OSError):
            return ""
