"""The sandbox client's retries, against a stand-in of the service on loopback that fails on purpose: a run is sent
again only when the service never took it; reading the limits is retried through any transient failure."""

from __future__ import annotations

import pytest

from tests.trainer.http.scripted import ScriptedService
from tests.trainer.sandbox.conftest import TOKEN
from trainer.sandbox import RemoteSandbox, SandboxError, SandboxLimits

RESULT = {"stdout": "42\n", "stderr": "", "exit_code": 0, "timed_out": False, "truncated": False,
          "memory_exceeded": False, "scratch_exceeded": False}


def failing_first(status: int, answer: dict):
    """A stand-in that answers `status` to the first request and `answer` to the others."""
    return lambda call, path, body: (status, {"error": "no backend"}) if call == 1 else (200, answer)


def sandbox_at(service: ScriptedService) -> RemoteSandbox:
    return RemoteSandbox(service.url, TOKEN, max_retries=2, backoff_seconds=0.01)


def test_a_run_the_service_turned_away_with_503_is_sent_again():
    with ScriptedService(failing_first(503, RESULT), token=TOKEN) as service:
        result = sandbox_at(service).run_python("print(6 * 7)", limits=SandboxLimits(wall_seconds=1))
    assert result.stdout == "42\n" and [seen.path for seen in service.seen] == ["/v1/run", "/v1/run"]
    assert service.seen[1].body["code"] == "print(6 * 7)"


def test_a_run_that_failed_with_500_is_not_sent_again():
    with ScriptedService(failing_first(500, RESULT), token=TOKEN) as service:  # it may have run before failing
        with pytest.raises(SandboxError, match=r"sandbox service \(http://127.0.0.1:\d+/v1/run\) answered HTTP 500"):
            sandbox_at(service).run_python("print(6 * 7)")
    assert len(service.seen) == 1


def test_reading_the_limits_is_retried_through_any_transient_failure():
    with ScriptedService(failing_first(500, {"max_limits": SandboxLimits().model_dump()}), token=TOKEN) as service:
        sandbox_at(service).check()
    assert [seen.path for seen in service.seen] == ["/v1/limits", "/v1/limits"]
