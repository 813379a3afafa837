"""What "transient" means for every HTTP API alignflow calls: the one definition, which `RetryPolicy` retries.

Transient: HTTP 408, 429, 500, 502, 503, 504; status 0, which the generated API clients (kubernetes,
kfp_server_api) report when TLS fails under them and this layer's client reports when no HTTP answer
came; and the connection failing under any client (refused, reset, cut short, not HTTP, timed out:
OSError, `http.client`'s and urllib3's errors). Everything else (400, 401, 403, 404, 409, 422, ...)
is an answer: retrying a request a server refuses changes nothing. A transient answer may say how
long to wait (`Retry-After`), which `retry_after_seconds` reads.

A request that must not run twice can only be sent again when the failure proves it was never
processed: `is_unprocessed` (a refused connection, or a status that says so). A reset, a timeout or
an answer cut short may come after the work was done.

What this leaves out: S3, whose errors are named by code (`trainer/storage/s3.py` classifies them).
"""

from __future__ import annotations

import datetime
import email.utils
import http.client

TRANSIENT_STATUSES = frozenset({0, 408, 429, 500, 502, 503, 504})
# Answers that say the request was not acted on: the server gave up waiting for it (408) or turned it away (429),
# or a proxy found no backend to take it (502, 503) or gave up waiting for one (504: the backend may still have run
# it, so only a caller that can bear a second run replays on it).
UNPROCESSED_STATUSES = frozenset({408, 429, 502, 503, 504})
MAX_DESCRIPTION_CHARS = 200


def one_line(text: str) -> str:
    """`text` with each run of whitespace (newlines included) as one space: a message stays one line."""
    return " ".join(text.split())


def http_status(err: BaseException) -> int | None:
    """The HTTP status an error carries (any client's exception with an integer `status`), or None."""
    status = getattr(err, "status", None)
    return status if isinstance(status, int) and not isinstance(status, bool) else None


def failure_cause(err: BaseException) -> BaseException:
    """The failure under a wrapper that keeps it as `reason` (urllib's URLError, this layer's ServiceCallError)."""
    reason = getattr(err, "reason", None)
    return reason if isinstance(reason, BaseException) else err


def connection_errors() -> tuple[type[BaseException], ...]:
    """The exception types of a connection failing under a client."""
    errors: tuple[type[BaseException], ...] = (OSError, http.client.HTTPException)
    try:  # imported here: only the generated API clients raise it, and urllib3 is not needed to serve or to train
        from urllib3.exceptions import HTTPError
    except ImportError:
        return errors
    return (*errors, HTTPError)


def is_transient(err: BaseException) -> bool:
    """Whether `err` is worth retrying: an answer with a transient status, or a failed connection."""
    status = http_status(err)
    if status is not None:
        return status in TRANSIENT_STATUSES
    return isinstance(err, connection_errors())


def is_unprocessed(err: BaseException) -> bool:
    """Whether `err` proves the request was never processed: a refused connection, or a status that says so."""
    status = http_status(err)
    if status:
        return status in UNPROCESSED_STATUSES
    return isinstance(failure_cause(err), ConnectionRefusedError)


def retry_after_seconds(err: BaseException) -> float:
    """The wait an answer's `Retry-After` header asks for (seconds, or an HTTP date); 0 when it asks none."""
    headers = getattr(err, "headers", None) or {}
    value = str(headers.get("Retry-After") or "").strip()
    if not value:
        return 0.0
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return 0.0
    if when.tzinfo is None:  # an HTTP date is GMT, whether or not it says so
        when = when.replace(tzinfo=datetime.timezone.utc)
    return max(0.0, (when - datetime.datetime.now(datetime.timezone.utc)).total_seconds())


def describe(err: BaseException) -> str:
    """A one-line account of a failure: `HTTP 503 Service Unavailable`, or the failure under the connection
    (`ConnectionRefusedError: [Errno 111] Connection refused`)."""
    status = http_status(err)
    if status:
        return one_line(f"HTTP {status} {getattr(err, 'reason', '') or ''}")[:MAX_DESCRIPTION_CHARS]
    cause = failure_cause(err)
    return one_line(f"{type(cause).__name__}: {cause}")[:MAX_DESCRIPTION_CHARS]
