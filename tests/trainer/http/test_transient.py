"""The one definition of transient, and what a failure's one-line account and Retry-After say."""

from __future__ import annotations

import email.utils
import http.client
import time
import urllib.error

import pytest

from trainer.errors import ConfigError
from trainer.http.errors import ServiceCallError
from trainer.http.transient import describe, is_transient, is_unprocessed, retry_after_seconds


def answer(status: int, headers: dict[str, str] | None = None, reason: str = "") -> ServiceCallError:
    return ServiceCallError("x", url="http://s/", status=status, reason=reason, headers=headers)


def test_statuses_and_connection_failures_are_sorted_once():
    assert all(is_transient(answer(status)) for status in (0, 408, 429, 500, 502, 503, 504))
    assert not any(is_transient(answer(status)) for status in (400, 401, 403, 404, 409, 422, 501))
    for failure in (ConnectionRefusedError(), ConnectionResetError(), TimeoutError(), http.client.IncompleteRead(b""),
                    http.client.BadStatusLine("SSH-2.0"), urllib.error.URLError(ConnectionRefusedError())):
        assert is_transient(failure), failure
    assert not is_transient(ValueError("bad")) and not is_transient(ConfigError("x"))


@pytest.mark.parametrize(("failure", "unprocessed"), [
    (ConnectionRefusedError(), True),  # nothing listened: the request never left
    (urllib.error.URLError(ConnectionRefusedError()), True),
    (ConnectionResetError(), False),  # it may have been read and run before the reset
    (TimeoutError(), False),
    (answer(503), True), (answer(502), True), (answer(429), True),
    (answer(500), False),  # a server error may come after the work was done
])
def test_only_a_failure_that_proves_nothing_ran_counts_as_unprocessed(failure, unprocessed):
    assert is_unprocessed(failure) is unprocessed


def test_retry_after_in_seconds_or_as_a_date():
    assert retry_after_seconds(answer(503, {"Retry-After": "7"})) == 7.0
    in_an_hour = email.utils.formatdate(time.time() + 3600, usegmt=True)
    assert 3500 < retry_after_seconds(answer(503, {"Retry-After": in_an_hour})) <= 3600
    assert retry_after_seconds(answer(503, {"Retry-After": email.utils.formatdate(0, usegmt=True)})) == 0.0  # past
    for headers in ({}, {"Retry-After": "soon"}, {"Retry-After": "-5"}):
        assert retry_after_seconds(answer(503, headers)) == 0.0
    assert retry_after_seconds(ConnectionResetError()) == 0.0


def test_describe_is_one_line_and_unwraps_the_failure_under_a_wrapper():
    assert describe(answer(503, reason="Service Unavailable: busy\nnow")) == "HTTP 503 Service Unavailable: busy now"
    refused = ConnectionRefusedError(111, "Connection refused")
    assert describe(urllib.error.URLError(refused)) == "ConnectionRefusedError: [Errno 111] Connection refused"
    assert describe(ServiceCallError("x", url="u", status=0, reason=refused)).startswith("ConnectionRefusedError")
    assert describe(http.client.BadStatusLine("SSH-2.0\r\n")) == "BadStatusLine: SSH-2.0"
    assert len(describe(ValueError("x" * 500))) == 200
