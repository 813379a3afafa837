"""The API server failing while a job runs: retried with backoff, and never a reason to delete the job.

Also: a job deleted by someone else fails the task at once. All through the real `kubernetes`
client against the loopback stand-in, with fault injection per request.
"""

from __future__ import annotations

import logging
import threading
import time

import pytest

from components.launcher.kinds.interface import JobDeleted
from components.launcher.shared.retry import ApiUnavailable, RetryPolicy
from tests.components.launcher.follow.test_launcher import NAME, launcher_for, manifest
from tests.components.launcher.kube_standin import KubeStandIn

JOB_PATH = f"/apis/kubeflow.org/v1/namespaces/ml/pytorchjobs/{NAME}"
WATCH = "/pytorchjobs$"


def deletes(standin: KubeStandIn) -> list[int]:
    """Positions of the DELETE requests of the job among all requests."""
    return [i for i, call in enumerate(standin.calls) if call.method == "DELETE" and call.path == JOB_PATH]


def test_a_503_during_the_watch_is_retried_and_does_not_delete_the_running_job(caplog):
    with KubeStandIn("succeed", step_seconds=1.0) as standin:
        standin.fail_next("GET", WATCH, 503, watch=True, count=2)
        with caplog.at_level(logging.WARNING, logger="components.launcher"):
            outcome = launcher_for(standin).run(manifest(), timeout=30)
        assert outcome.phase == "Succeeded"
        assert [fault.count for fault in standin.faults] == [0]  # both 503s were served
        # The only DELETE is the cleanup after success, the last request made.
        assert deletes(standin) == [len(standin.calls) - 1]
    retries = [r.getMessage() for r in caplog.records if "HTTP 503" in r.getMessage()]
    assert len(retries) == 2 and "retry 1 of 3" in retries[0] and "retry 2 of 3" in retries[1]


def test_429_with_retry_after_and_a_connection_reset_mid_watch_are_retried():
    with KubeStandIn("succeed", step_seconds=1.0) as standin:
        standin.fail_next("GET", WATCH, 429, watch=True, retry_after=1)
        standin.fail_next("GET", WATCH, "reset", watch=True, after_events=1)  # RST after one event
        started = time.monotonic()
        outcome = launcher_for(standin).run(manifest(), timeout=30)
        assert outcome.phase == "Succeeded"
        assert [fault.count for fault in standin.faults] == [0, 0]
        assert deletes(standin) == [len(standin.calls) - 1]
    assert time.monotonic() - started >= 1.0  # the server's Retry-After was honoured


def test_an_expired_watch_lists_again_and_watches_from_the_fresh_resource_version(caplog):
    caplog.set_level(logging.INFO, logger="components.launcher")
    with KubeStandIn("succeed", step_seconds=1.0) as standin:
        # The server compacts its history just before the second watch request: that watch's version is gone.
        standin.fail_next("GET", WATCH, "expire", watch=True, skip=1)
        launcher = launcher_for(standin)
        outcome = launcher.run(manifest(), timeout=30)
        assert outcome.phase == "Succeeded"
        calls = standin.calls
        expired = [i for i, c in enumerate(calls) if c.query.get("watch", "").lower() == "true"][1]
        relist = next(i for i, c in enumerate(calls) if i > expired and c.method == "GET" and "watch" not in c.query
                      and c.path.endswith("/pytorchjobs"))
        next_watch = next(c for c in calls[relist:] if c.query.get("watch", "").lower() == "true")
        # The new watch starts at (or after) the compaction, i.e. at the re-list's fresh version.
        assert int(next_watch.query["resourceVersion"]) >= standin.store.compacted
        assert int(calls[expired].query["resourceVersion"]) < standin.store.compacted
        assert deletes(standin) == [len(calls) - 1]
    assert any("expired (410 Gone): listing it again" in r.getMessage() for r in caplog.records)


def test_an_api_that_stays_down_fails_the_task_but_leaves_the_job_running(caplog):
    with KubeStandIn("hang") as standin:
        standin.fail_next("GET", WATCH, 503, watch=True, count=100)
        with caplog.at_level(logging.ERROR, logger="components.launcher"):
            with pytest.raises(ApiUnavailable, match="kept failing .*HTTP 503.* after 3 retries"):
                launcher_for(standin).run(manifest(), timeout=30)
        assert deletes(standin) == [] and list(standin.jobs) == [("ml", NAME)]
    assert any("left running (a retry of the task re-attaches to it)" in r.getMessage() for r in caplog.records)


def test_a_job_deleted_from_outside_fails_the_task_at_once(caplog):
    with KubeStandIn("hang") as standin:
        launcher = launcher_for(standin)
        launcher.poll_seconds = 30  # one long watch: the DELETED event must end it, not a timeout
        threading.Timer(1.0, standin.delete_job, ("ml", NAME)).start()
        started = time.monotonic()
        with caplog.at_level(logging.INFO, logger="components.launcher"):
            with pytest.raises(JobDeleted, match=f"PyTorchJob ml/{NAME} was deleted externally"):
                launcher.run(manifest(), timeout=60)
        assert time.monotonic() - started < 5
        assert deletes(standin) == []  # nothing left to delete


def test_a_job_that_is_gone_when_read_fails_the_task():
    with KubeStandIn("hang") as standin:
        with pytest.raises(JobDeleted, match="deleted externally \\(not found when listed\\)"):
            launcher_for(standin).wait("ml", "af-never-created", timeout=10)


def test_backoff_doubles_up_to_its_cap_and_honours_retry_after():
    from kubernetes.client.exceptions import ApiException

    waits: list[float] = []
    policy = RetryPolicy(max_retries=5, base_seconds=1.0, max_seconds=5.0, sleep=waits.append)
    for _ in range(4):
        policy.failed(ApiException(status=503), "watch")
    assert waits == [1.0, 2.0, 4.0, 5.0]
    busy = ApiException(status=429)
    busy.headers = {"Retry-After": "3"}
    policy.succeeded()  # a success starts the count again
    policy.failed(busy, "watch")
    assert waits[-1] == 3.0
    for _ in range(4):
        policy.failed(ApiException(status=500), "watch")
    with pytest.raises(ApiUnavailable, match="watch: the Kubernetes API kept failing \\(HTTP 500\\) after 5 retries"):
        policy.failed(ApiException(status=500), "watch")


def test_answers_are_not_retried():
    from kubernetes.client.exceptions import ApiException

    policy = RetryPolicy(sleep=lambda seconds: None)

    def forbidden():
        raise ApiException(status=403, reason="Forbidden")

    with pytest.raises(ApiException):
        policy.call(forbidden, "list")
    assert policy.failures == 0
