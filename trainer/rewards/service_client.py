"""The HTTP client every remote reward source uses: JSON POSTs with a timeout, retries, a concurrency limit, a token.

Standard library only (`urllib`): a reward service and an OpenAI-compatible judge both take one JSON
POST and answer JSON, which needs no client package. A request that cannot connect, times out or
gets HTTP 429 or 5xx is retried `max_retries` times, waiting `backoff_seconds`, then twice that,
and so on; after the last try it is a `ServiceUnavailable`. Any other HTTP error, or an answer that
is not JSON, is a `RewardError` at once: retrying a request the service refuses changes nothing.

The bearer token is read from the environment variable `token_env` or the file `token_file` (a
Kubernetes Secret, as env or as a mounted volume) when the client is built, kept in a private
attribute, sent only in the Authorization header, and never put into a message, a repr or a log.
"""

from __future__ import annotations

import json
import logging
import os
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from trainer.config.rewards import ServiceConfig
from trainer.errors import ConfigError, RewardError

logger = logging.getLogger(__name__)
RETRIED_STATUSES = frozenset({408, 429, 500, 502, 503, 504})


class ServiceUnavailable(RewardError):
    """A reward service stayed unreachable (or overloaded) through every retry."""


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
        self._token = read_token(options, key, environ)

    def __repr__(self) -> str:  # the token stays out of every repr (and so of tracebacks' locals printers)
        return f"ServiceClient({self.name!r}, {self.options.url!r})"

    def post(self, url: str, body: Any) -> Any:
        """The JSON answer to one POST of `body`, retried as the module docstring says."""
        data = json.dumps(body).encode()
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self._token is not None:
            headers["Authorization"] = f"Bearer {self._token}"
        attempts = self.options.max_retries + 1
        for attempt in range(attempts):
            try:
                return self._send(urllib.request.Request(url, data=data, headers=headers, method="POST"))
            except ServiceUnavailable as err:
                if attempt + 1 == attempts:
                    raise ServiceUnavailable(f"{err} (after {attempts} tries)") from err
                delay = self.options.backoff_seconds * 2 ** attempt
                logger.warning("%s; retrying in %.2f s", err, delay)
                time.sleep(delay)
        raise AssertionError("unreachable")

    def post_all(self, url: str, bodies: list[Any]) -> list[Any]:
        """`post` of each body, at most `max_concurrency` at once; each result is the answer or the
        `ServiceUnavailable` it ended with (other errors are raised)."""

        def one(body: Any) -> Any:
            try:
                return self.post(url, body)
            except ServiceUnavailable as err:
                return err

        if len(bodies) == 1:
            return [one(bodies[0])]
        with ThreadPoolExecutor(max_workers=min(self.options.max_concurrency, len(bodies)),
                                thread_name_prefix=f"reward-{self.name}") as pool:
            return list(pool.map(one, bodies))

    def _send(self, request: urllib.request.Request) -> Any:
        where = f"reward service {self.name} ({request.full_url})"
        try:
            with urllib.request.urlopen(request, timeout=self.options.timeout_seconds) as response:
                raw = response.read()
        except urllib.error.HTTPError as err:
            if err.code in RETRIED_STATUSES:
                raise ServiceUnavailable(f"{where} answered HTTP {err.code}") from None
            detail = err.read()[:200].decode(errors="replace").strip()
            raise RewardError(f"{where} answered HTTP {err.code} {err.reason}: {detail}") from None
        except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as err:
            reason = getattr(err, "reason", err)
            raise ServiceUnavailable(f"{where} is unreachable: {reason}") from None
        try:
            return json.loads(raw)
        except ValueError:
            raise RewardError(f"{where} answered something that is not JSON: {raw[:80]!r}") from None
