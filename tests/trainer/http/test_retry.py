"""The retry policy's waits: doubled and capped, stretched by jitter, longer on Retry-After, bounded by the budget and
the deadline. (Its `call` against real servers: test_client.py; with the launcher's defaults: tests/components.)"""

from __future__ import annotations

import time

import pytest

from trainer.http.errors import ServiceCallError, ServiceUnavailableError
from trainer.http.retry import RetryPolicy

BUSY = ServiceCallError("busy", url="http://s/", status=503, reason="Service Unavailable")


def test_the_waits_double_up_to_the_cap():
    assert RetryPolicy(5, 1.0, 4.0).waits() == [1.0, 2.0, 4.0, 4.0, 4.0]
    assert RetryPolicy(0).waits() == [] and RetryPolicy(200, 1.0, 30.0).waits()[-1] == 30.0  # no overflow


def test_jitter_only_lengthens_a_wait_and_by_at_most_its_share():
    policy = RetryPolicy(1000, 1.0, 1.0, jitter=0.25)
    waits = [policy.next_wait(BUSY) for _ in range(1000)]
    assert all(1.0 <= wait <= 1.25 for wait in waits) and max(waits) - min(waits) > 0.1


def test_retry_after_lengthens_a_wait_within_the_cap():
    asking = ServiceCallError("busy", url="u", status=503, reason="", headers={"Retry-After": "3"})
    assert RetryPolicy(3, 0.5, 10.0).next_wait(asking) == 3.0
    assert RetryPolicy(3, 0.5, 2.0).next_wait(asking) == 2.0


def test_the_budget_counts_failures_in_a_row_and_a_success_resets_it():
    policy = RetryPolicy(2, 0.0, sleep=lambda seconds: None)
    policy.failed(BUSY, "get")
    policy.succeeded()
    policy.failed(BUSY, "get")
    policy.failed(BUSY, "get")
    with pytest.raises(ServiceUnavailableError, match=r"^get: the service kept failing \(HTTP 503 Service "
                                                      r"Unavailable\) after 2 retries$"):
        policy.failed(BUSY, "get")


def test_a_wait_past_the_deadline_is_not_made():
    slept: list[float] = []
    policy = RetryPolicy(8, 10.0, sleep=slept.append, deadline=time.monotonic() + 5, api="the KFP API")
    assert policy.next_wait(BUSY) is None
    with pytest.raises(ServiceUnavailableError, match="the KFP API kept failing .* until the deadline"):
        policy.failed(BUSY, "get_run r")
    assert slept == []
