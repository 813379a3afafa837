"""How a reward service's client fails: every transport error retried or reported in one line, a restart ridden out,
a step that stops once one request has failed for good. Against real servers on loopback, no mocked client."""

from __future__ import annotations

import logging
import threading

import pytest

from tests.trainer.rewards.servers import RawService, ScriptedService, free_port, json_reply
from trainer.config.rewards import JudgeConfig, ServiceConfig
from trainer.errors import RewardError
from trainer.rewards.judge import JudgeScorer
from trainer.rewards.remote import RemoteScorer
from trainer.rewards.service_client import ServiceClient, retry_policy

PROMPTS, COMPLETIONS, ANSWERS = ["1+2=", "3+4="], ["3", "7"], ["3", "7"]
GOOD = json_reply({"scores": [1.0, 0.5]})
# Each way a request can break below a well-formed HTTP error, and the name the one-line message gives it.
BROKEN = {
    "answer cut short": (b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{\"sco", "IncompleteRead"),
    "status line not HTTP": (b"SSH-2.0-OpenSSH_9.6\r\n", "BadStatusLine"),
    "closed without an answer": (b"", "RemoteDisconnected"),
    "connection reset": (RawService.RESET, "ConnectionResetError"),
    "no answer within the timeout": (1.0, "TimeoutError"),
    "HTTP 503": (json_reply({"error": "busy"}, "503 Service Unavailable"), "HTTP 503"),
    "HTTP 429": (json_reply({"error": "slow down"}, "429 Too Many Requests"), "HTTP 429"),
}


def scorer_for(url: str, **options) -> RemoteScorer:
    options = {"backoff_seconds": 0.01, "timeout_seconds": 0.3, **options}
    return RemoteScorer("rm", ServiceClient("rm", ServiceConfig(url=url, **options), "reward.sources.0.service", {}))


@pytest.mark.parametrize("kind", BROKEN)
def test_each_transport_error_is_retried_until_the_service_answers(kind):
    broken, _ = BROKEN[kind]
    service = RawService(lambda number: broken if number <= 2 else GOOD)
    try:
        scores = scorer_for(service.url + "/score", max_retries=2).score(PROMPTS, COMPLETIONS, ANSWERS)
    finally:
        service.stop()
    assert scores == [1.0, 0.5] and service.connections == 3  # two broken tries, then the answer


@pytest.mark.parametrize("kind", BROKEN)
def test_a_transport_error_that_lasts_is_one_line_naming_the_url(kind):
    broken, name = BROKEN[kind]
    service = RawService(lambda number: broken)
    try:
        with pytest.raises(RewardError) as error:
            scorer_for(service.url + "/score", max_retries=1).score(PROMPTS, COMPLETIONS, ANSWERS)
    finally:
        service.stop()
    message = str(error.value)
    assert message.startswith(f"reward service rm ({service.url}/score) ") and name in message
    assert "after 2 tries" in message and message.endswith("on_failure is fail, so the run stops")
    assert "\n" not in message and error.value.__cause__ is None  # the CLI prints exactly this line


@pytest.mark.parametrize("kind", BROKEN)
def test_on_failure_zero_covers_every_transport_error_with_one_warning(kind, caplog):
    broken, name = BROKEN[kind]
    service = RawService(lambda number: broken)
    scorer = scorer_for(service.url + "/score", max_retries=1, on_failure="zero", batch_size=1)
    try:
        with caplog.at_level(logging.WARNING):
            assert scorer.score(PROMPTS, COMPLETIONS, ANSWERS) == [0.0, 0.0]
    finally:
        service.stop()
    assert scorer.counters() == {"failed_rows": 2.0}
    zeroed = [record.getMessage() for record in caplog.records if "on_failure zero" in record.getMessage()]
    assert len(zeroed) == 1 and name in zeroed[0] and "2 unanswered rows" in zeroed[0]


def test_the_default_retry_budget_rides_out_a_30_second_restart():
    defaults = ServiceConfig(url="http://rm:8000/score")
    assert retry_policy(defaults).waits() == [0.5, 1, 2, 4, 8, 10, 10, 10]  # doubled, capped at max_backoff_seconds
    assert sum(retry_policy(defaults).waits()) >= 30  # jitter only lengthens the waits
    capped = ServiceConfig(url="http://rm:8000/score", backoff_seconds=1, max_backoff_seconds=4, max_retries=5)
    assert retry_policy(capped).waits() == [1, 2, 4, 4, 4]


class LateService:
    """A service that starts listening on a free port `outage` seconds from now (until then connections are
    refused: a pod restarting)."""

    def __init__(self, outage: float) -> None:
        self.port = free_port()
        self.started: list[ScriptedService] = []
        answer = lambda body, call: (200, {"scores": [1.0] * len(body["prompts"])})  # noqa: E731
        self.timer = threading.Timer(outage, lambda: self.started.append(ScriptedService(answer, port=self.port)))
        self.timer.start()

    def stop(self) -> None:
        self.timer.join()
        for service in self.started:
            service.stop()


@pytest.mark.parametrize(("waits", "rides_out"), [
    ({"max_retries": 5, "backoff_seconds": 0.25, "max_backoff_seconds": 1.0}, True),  # 0.25+0.5+1+1+1 = 3.75 s
    ({"max_retries": 2, "backoff_seconds": 0.25, "max_backoff_seconds": 1.0}, False),  # 0.25+0.5 = 0.75 s
])
def test_a_budget_longer_than_the_outage_rides_it_out(waits, rides_out):
    outage = 1.5
    assert (sum(retry_policy(ServiceConfig(url="http://rm/", **waits)).waits()) > outage) is rides_out
    service = LateService(outage)
    try:
        scorer = scorer_for(f"http://127.0.0.1:{service.port}/score", **waits)
        if rides_out:
            assert scorer.score(PROMPTS, COMPLETIONS, ANSWERS) == [1.0, 1.0]
        else:
            with pytest.raises(RewardError, match=r"is unreachable.*ConnectionRefusedError.*after 3 tries"):
                scorer.score(PROMPTS, COMPLETIONS, ANSWERS)
    finally:
        service.stop()


def test_a_dead_service_fails_a_many_row_step_in_one_retry_budget():
    service = ScriptedService(lambda body, call: (503, {"error": "down"}))
    options = {"max_retries": 2, "backoff_seconds": 0.3, "max_concurrency": 4, "batch_size": 1}
    rows = 24  # one request each: 24 x 3 tries = 72 requests, six rounds of 0.9 s, if each request retried alone
    try:
        with pytest.raises(RewardError, match=r"answered HTTP 503 Service Unavailable: down \(after 3 tries"):
            scorer_for(service.url, **options).score(["1+1="] * rows, ["2"] * rows, ["2"] * rows)
    finally:
        service.stop()
    assert len(service.bodies) <= 4 * 3  # the requests in flight when the first gave up, and no others


def test_a_slow_judge_fails_a_step_in_about_one_timeout_budget():
    service = ScriptedService(lambda body, call: (200, {"choices": [{"message": {"content": "Score: 5"}}]}), delay=1.5)
    options = ServiceConfig(url=service.url + "/v1", timeout_seconds=0.3, max_retries=1, backoff_seconds=0.05,
                            max_concurrency=4, on_failure="zero")
    judge = JudgeScorer("judge", ServiceClient("judge", options, "reward.sources.1.service", {}),
                        JudgeConfig(model="m", rubric="{prompt} {response}"))
    rows = 16  # distinct rows: 16 requests, four rounds of 0.65 s, if each retried alone
    try:
        assert judge.score([f"{n}+0=" for n in range(rows)], ["x"] * rows, [None] * rows) == [0.0] * rows
    finally:
        service.stop()
    # The four requests in flight each tried twice, and no other row was sent: about one budget.
    assert judge.counters()["failed_rows"] == rows and len(service.bodies) <= 4 * 2
