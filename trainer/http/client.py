"""A JSON client for one HTTP service: a request with a timeout, an optional bearer token, retries per a RetryPolicy.

Standard library only (`urllib`): every service alignflow talks to takes a JSON body and answers
JSON, which needs no client package. `send` is one try; `request` is `send` retried by the policy a
caller passes (a request that must not run twice passes one whose `retry_if` is `is_unprocessed`).
`status_of` only asks whether something serves HTTP at a URL.

Errors (`trainer.http.errors`), each one line naming the service and the URL: an error status or no
HTTP answer at all is a `ServiceCallError` (status 0 for the latter: refused, reset, cut short, not
HTTP, timed out), which `is_transient` classifies; an answer that is not JSON, a URL that cannot be
used or a token file that cannot be read is a `ServiceError`. An error answer's message quotes its
JSON `error` text when it has one (the convention of alignflow's servers and most APIs), else its start.

The token is a value, or a file read again before every request (a projected service-account token,
which the kubelet rotates). It is sent only in the Authorization header, kept out of the repr, and
masked (`***`) in every message built from what a service sent: an error body or an answer that
quotes the header back. The client logs nothing; the policy logs its retries with those messages.
"""

from __future__ import annotations

import http.client
import json
import ssl
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trainer.http.errors import ServiceCallError, ServiceError
from trainer.http.retry import RetryPolicy
from trainer.http.transient import MAX_DESCRIPTION_CHARS, describe, failure_cause, one_line
from trainer.redact import MIN_SECRET_LENGTH, mask_secrets

MAX_ERROR_BODY_BYTES = 64 * 1024  # read (and masked) before a message keeps its start


class BearerToken:
    """A bearer token: a `value`, or a file at `path` read again for every request."""

    def __init__(self, value: str | None = None, *, path: str | Path | None = None) -> None:
        if (value is None) == (path is None):
            raise ValueError("a bearer token is a value or a file, exactly one of them")
        self._value = value
        self.path = None if path is None else Path(path)

    def __repr__(self) -> str:
        return f"BearerToken(path={str(self.path)!r})" if self.path else "BearerToken('***')"

    def read(self) -> str:
        """The token now (OSError if its file cannot be read)."""
        return self._value if self.path is None else self.path.read_text().strip()


class JsonClient:
    """Sends JSON requests to one service and reads its JSON answers (see the module docstring).

    Args:
        service: How messages name the service (`reward service rm`, `sandbox service`).
        token: The bearer token each request carries; None: no Authorization header.
        timeout_seconds: How long one try may take, unless the request says otherwise.
        ssl_context: How an https service's certificate is checked (a cluster's CA); None: the system's way.
    """

    def __init__(self, service: str, *, token: BearerToken | None = None, timeout_seconds: float = 30.0,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        self.service = service
        self.timeout_seconds = timeout_seconds
        self.ssl_context = ssl_context
        self._token = token
        self._sent_token = "" if token is None or token.path else token.read()  # what `blank` masks

    def __repr__(self) -> str:  # the token stays out of every repr (and so of tracebacks' locals printers)
        return f"JsonClient({self.service!r})"

    def blank(self, text: str) -> str:
        """`text` with the token masked: every message built from what a service sent passes here. (A token
        shorter than MIN_SECRET_LENGTH is no real credential, and masking it would mangle ordinary words.)"""
        return mask_secrets(text, [self._sent_token] if len(self._sent_token) >= MIN_SECRET_LENGTH else [])

    def request(self, method: str, url: str, body: Any = None, *, retry: RetryPolicy | None = None,
                timeout: float | None = None, expect_answer: bool = True) -> Any:
        """`send`, retried through the failures `retry` accepts (a fresh policy per request; None: one try).

        Raises:
            ServiceError: A failure `retry` does not retry; its `unavailable` error once it gives up.
        """
        if retry is None:
            return self.send(method, url, body, timeout=timeout, expect_answer=expect_answer)
        return retry.call(self.send, f"{method} {url}", method, url, body, timeout=timeout,
                          expect_answer=expect_answer)

    def send(self, method: str, url: str, body: Any = None, *, timeout: float | None = None,
             expect_answer: bool = True) -> Any:
        """One try: the JSON answer to `body` (None for an empty answer, or with `expect_answer` False).

        Raises:
            ServiceCallError: An error status, or no HTTP answer (status 0).
            ServiceError: An answer that is not JSON, a URL that cannot be used, a token file that cannot be read.
        """
        status, reason, headers, raw = self._exchange(method, url, body, timeout, with_token=True)
        where = f"{self.service} ({url})"
        if not 200 <= status < 300:
            detail = self.blank(error_detail(raw))[:MAX_DESCRIPTION_CHARS]  # masked before cut: no token half shows
            reason = f"{reason}: {detail}" if detail else str(reason)
            raise ServiceCallError(f"{where} answered HTTP {status} {reason}".rstrip(), url=url, status=status,
                                   reason=reason, headers=headers)
        if not expect_answer or not raw.strip():
            return None
        try:
            return json.loads(raw)
        except ValueError:
            raise ServiceError(self.blank(f"{where} answered something that is not JSON: {raw[:80]!r}")) from None

    def status_of(self, url: str, *, timeout: float | None = None) -> int:
        """The status a GET of `url` without the token answers, whatever it is (whether something serves HTTP there).

        Raises:
            ServiceCallError: Nothing answers HTTP there (status 0).
        """
        return self._exchange("GET", url, None, timeout, with_token=False)[0]

    def _exchange(self, method: str, url: str, body: Any, timeout: float | None, *,
                  with_token: bool) -> tuple[int, str, Mapping[str, str], bytes]:
        """(status, reason, headers, body) of any answer; ServiceCallError (status 0) when none came."""
        where = f"{self.service} ({url})"
        headers = {"Accept": "application/json"}
        data = None if body is None else json.dumps(body).encode()
        if data is not None:
            headers["Content-Type"] = "application/json"
        if with_token and self._token is not None:
            headers["Authorization"] = f"Bearer {self._read_token(where)}"
        try:
            request = urllib.request.Request(url, data=data, headers=headers, method=method)
            with urllib.request.urlopen(request, timeout=timeout or self.timeout_seconds,
                                        context=self.ssl_context) as response:
                return response.status, response.reason, response.headers, response.read()
        except urllib.error.HTTPError as err:  # an answer all the same: its status decides
            return err.code, err.reason, err.headers, read_error_body(err)
        except (http.client.InvalidURL, ValueError) as err:  # a URL urllib cannot even try
            raise ServiceError(f"{where}: the URL cannot be used ({err})") from None
        except (http.client.HTTPException, OSError) as err:  # refused, reset, cut short, not HTTP, timed out
            raise ServiceCallError(self.blank(f"{where} is unreachable or broke off: {describe(err)}"), url=url,
                                   status=0, reason=failure_cause(err)) from None

    def _read_token(self, where: str) -> str:
        try:
            token = self._token.read()
        except OSError as err:
            raise ServiceError(f"{where}: cannot read the token file {self._token.path}: {err.strerror}") from None
        self._sent_token = token
        return token


def read_error_body(err: urllib.error.HTTPError) -> bytes:
    """The start of an error answer's body; empty when it cannot be read."""
    try:
        return err.read(MAX_ERROR_BODY_BYTES)
    except (http.client.HTTPException, OSError):
        return b""


def error_detail(raw: bytes) -> str:
    """What an error answer says: its JSON `error` text (`{"error": "..."}`, or OpenAI's `{"error": {"message":
    "..."}}`) when it has one, else its text."""
    text = raw.decode(errors="replace")
    try:
        error = json.loads(text).get("error")
    except (ValueError, AttributeError):
        return one_line(text)
    if isinstance(error, Mapping):
        error = error.get("message")
    return one_line(error) if isinstance(error, str) else one_line(text)
