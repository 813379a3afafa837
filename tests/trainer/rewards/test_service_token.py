"""A client's own bearer token is blanked out of every message it builds, even when a service quotes the token back:
in an error body, in an answer that is not JSON, in a judge's reply. Against real servers on loopback."""

from __future__ import annotations

import logging

import pytest

from tests.trainer.rewards.conftest import TOKEN
from tests.trainer.rewards.servers import ScriptedService
from trainer.config.rewards import JudgeConfig, ServiceConfig
from trainer.errors import RewardError
from trainer.rewards.judge import JudgeScorer
from trainer.rewards.remote import RemoteScorer
from trainer.rewards.service_client import ServiceClient

PROMPTS, COMPLETIONS, ANSWERS = ["1+2="], ["3"], ["3"]
ENV = {"REWARD_TOKEN": TOKEN}


def client_for(url: str, **options) -> ServiceClient:
    options = {"token_env": "REWARD_TOKEN", "backoff_seconds": 0.01, "max_retries": 1, **options}
    return ServiceClient("rm", ServiceConfig(url=url, **options), "reward.sources.0.service", ENV)


def echoing(status: int, shape: str) -> ScriptedService:
    """A service that answers `status` with a body quoting the request's Authorization header per `shape`."""
    service = ScriptedService(None)
    service.respond = lambda body, call, headers: (status, shape.format(header=headers.get("Authorization")))
    return service


@pytest.mark.parametrize(("status", "shape"), [
    (401, '{{"error": "invalid credentials in Authorization: {header}"}}'),
    (401, "x" * 190 + " {header}"),  # the token straddles the 200 characters a message keeps of a body
    (403, "forbidden\n{header}\n"),
    (200, "<html>you sent {header}</html>"),  # not JSON: the message quotes its start
])
def test_a_body_quoting_the_token_shows_it_masked(status, shape, caplog):
    service = echoing(status, shape)
    try:
        with caplog.at_level(logging.DEBUG), pytest.raises(RewardError) as error:
            RemoteScorer("rm", client_for(service.url)).score(PROMPTS, COMPLETIONS, ANSWERS)
    finally:
        service.stop()
    assert service.headers[0]["Authorization"] == f"Bearer {TOKEN}"  # it was sent, and quoted back
    message = str(error.value)
    assert TOKEN[:8] not in message and "Bearer **" in message and "\n" not in message  # the mask may be cut
    assert TOKEN[:8] not in caplog.text


@pytest.mark.parametrize("on_unparsed", ["fail", "zero"])
def test_a_judge_reply_quoting_the_token_shows_it_masked(on_unparsed, caplog):
    service = echoing(200, '{{"choices": [{{"message": {{"content": "no score; you sent {header}"}}}}]}}')
    judge = JudgeScorer("judge", client_for(service.url + "/v1"),
                        JudgeConfig(model="m", rubric="{response}", on_unparsed=on_unparsed))
    try:
        with caplog.at_level(logging.DEBUG):
            if on_unparsed == "fail":
                with pytest.raises(RewardError, match=r"Bearer \*\*\*") as error:
                    judge.score(PROMPTS, COMPLETIONS, ANSWERS)
                assert TOKEN[:8] not in str(error.value)
            else:
                assert judge.score(PROMPTS, COMPLETIONS, ANSWERS) == [0.0]
    finally:
        service.stop()
    assert TOKEN[:8] not in caplog.text
    assert on_unparsed == "fail" or "Bearer ***" in caplog.text
