"""The LLM judge against the reference server's OpenAI-compatible route: rubric, parsing, caching, failure rule."""

from __future__ import annotations

import math

import pytest

from tests.trainer.rewards.conftest import TOKEN
from tests.trainer.rewards.servers import ScriptedService
from trainer.config.rewards import JudgeConfig, ServiceConfig
from trainer.errors import RewardError
from trainer.rewards.judge import JudgeScorer, parse_score
from trainer.rewards.remote import RemoteScorer
from trainer.rewards.service_client import ServiceClient

RUBRIC = "Q: {prompt} A: {response} (expected {answer})"


def judge_for(url: str, **judge_options) -> JudgeScorer:
    service = ServiceConfig(url=url, token_env="JUDGE_TOKEN", backoff_seconds=0.01)
    client = ServiceClient("judge", service, "reward.sources.1.service", {"JUDGE_TOKEN": TOKEN})
    return JudgeScorer("judge", client, JudgeConfig(model="tiny-rm", rubric=RUBRIC, **judge_options))


def test_parse_score_reads_the_last_score_in_range():
    options = JudgeConfig(model="m", min_score=1, max_score=5)
    assert parse_score("Score: 2 at first... on reflection Score: 4", options) == pytest.approx(0.75)
    assert parse_score("score = 1", options) == 0.0
    assert parse_score("Score: 7", options) is None  # outside [1, 5]
    assert parse_score("I would give it four", options) is None


def test_judge_scores_through_the_chat_route_and_sends_identical_requests_once(reward_server):
    judge = judge_for(reward_server.url + "/v1")
    prompts, responses, answers = ["1+2=", "1+2=", "1+2=", "3+4="], ["3", "3", "4", "7"], ["3", "3", "3", "7"]
    before = reward_server.health()["requests"]["chat"]
    rewards = judge.score(prompts, responses, answers)
    assert reward_server.health()["requests"]["chat"] - before == 3  # rows 0 and 1 ask the same question
    assert judge.counters()["requests"] == 3
    # The reference server answers `Score: 10 * sigmoid(r)` with r the reward model's score of the rubric text;
    # the judge maps it back to [0, 1]: sigmoid(r). Check it against the server's own /score route.
    texts = [RUBRIC.format(prompt=p, response=r, answer=a) for p, r, a in zip(prompts, responses, answers)]
    remote = RemoteScorer("rm", ServiceClient("rm", ServiceConfig(url=reward_server.url + "/score",
                                                                  token_env="T"), "k", {"T": TOKEN}))
    raw = remote.score([""] * 4, texts, [None] * 4)
    assert rewards == pytest.approx([1 / (1 + math.exp(-r)) for r in raw], abs=1e-4)
    assert rewards[0] == rewards[1] and rewards[0] != rewards[2]


def test_unparsed_reply_fails_in_one_line_or_scores_zero_when_asked(reward_server):
    with pytest.raises(RewardError) as error:
        judge_for(reward_server.url + "/v1", score_pattern=r"Verdict: (\d+)").score(["1+2="], ["3"], ["3"])
    message = str(error.value)
    assert "\n" not in message
    assert "judge judge (http://127.0.0.1:" in message and "row 0 (prompt '1+2=')" in message
    assert "matching judge.score_pattern in the reply 'Score: " in message
    lenient = judge_for(reward_server.url + "/v1", score_pattern=r"Verdict: (\d+)", on_unparsed="zero")
    assert lenient.score(["1+2=", "2+2="], ["3", "4"], ["3", "4"]) == [0.0, 0.0]
    assert lenient.counters()["unparsed"] == 2


def test_a_reply_that_is_not_a_chat_completion_always_fails():
    service = ScriptedService(lambda body, call: (200, {"choices": []}))
    try:
        with pytest.raises(RewardError, match=r"row 0 .*no choices\[0\]\.message\.content"):
            judge_for(service.url, on_unparsed="zero").score(["1+2="], ["3"], ["3"])
    finally:
        service.stop()
    assert service.bodies[0]["model"] == "tiny-rm" and service.bodies[0]["temperature"] == 0.0
    assert service.bodies[0]["messages"] == [{"role": "user", "content": "Q: 1+2= A: 3 (expected 3)"}]
    assert service.headers[0]["Authorization"] == f"Bearer {TOKEN}"
