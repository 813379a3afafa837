"""A reward service over HTTP: the reference server's scores, batching, the token, retries, outages, bad answers."""

from __future__ import annotations

import logging
import math

import pytest
import torch

from tests.trainer.rewards.conftest import TOKEN
from tests.trainer.rewards.servers import RewardServer, ScriptedService
from trainer.config.rewards import ServiceConfig
from trainer.errors import ConfigError, RewardError
from trainer.rewards.remote import RemoteScorer
from trainer.rewards.service_client import ServiceClient

PROMPTS = ["1+2=", "3+4=", "5+1=", "2+2=", "9+0="]
COMPLETIONS = ["3", "7", "9", "4", "9"]
ANSWERS = ["3", "7", "6", "4", None]
ENV = {"REWARD_TOKEN": TOKEN}


def scorer_for(url: str, environ=ENV, **options) -> RemoteScorer:
    options = {"token_env": "REWARD_TOKEN", "backoff_seconds": 0.01, **options}
    return RemoteScorer("rm", ServiceClient("rm", ServiceConfig(url=url, **options), "reward.sources.0.service",
                                            environ))


@torch.no_grad()
def classifier_scores(model_dir, prompts, completions) -> list[float]:
    """The saved classifier's own logit at the last token of prompt + completion + EOS (independent of the server)."""
    from transformers import AutoModelForSequenceClassification

    from trainer.modeling.models import load_tokenizer

    tokenizer = load_tokenizer(str(model_dir))
    model = AutoModelForSequenceClassification.from_pretrained(model_dir).eval()
    scores = []
    for prompt, completion in zip(prompts, completions):
        ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        ids += tokenizer(completion + tokenizer.eos_token, add_special_tokens=False)["input_ids"]
        scores.append(model(input_ids=torch.tensor([ids])).logits[0, 0].item())
    return scores


def test_reference_server_scores_rows_as_the_reward_model_does(reward_server, reward_model_dir):
    before = reward_server.health()["requests"]["score"]
    scores = scorer_for(reward_server.url + "/score", batch_size=2).score(PROMPTS, COMPLETIONS, ANSWERS)
    assert scores == pytest.approx(classifier_scores(reward_model_dir, PROMPTS, COMPLETIONS), abs=1e-4)
    assert reward_server.health()["requests"]["score"] - before == 3  # 5 rows in batches of 2


def test_missing_or_wrong_token_is_refused_and_never_shown(reward_server, caplog):
    with pytest.raises(RewardError, match="HTTP 401") as error:
        scorer_for(reward_server.url + "/score", token_env=None).score(PROMPTS, COMPLETIONS, ANSWERS)
    assert "rm" in str(error.value) and reward_server.url in str(error.value)
    with caplog.at_level(logging.DEBUG), pytest.raises(RewardError, match="HTTP 401"):
        scorer_for(reward_server.url + "/score", environ={"REWARD_TOKEN": "wrong"}).score(PROMPTS, COMPLETIONS,
                                                                                        ANSWERS)
    with pytest.raises(ConfigError, match="reward.sources.0.service.token_env names REWARD_TOKEN, which is not set"):
        scorer_for(reward_server.url + "/score", environ={})
    client = scorer_for(reward_server.url + "/score").client
    assert TOKEN not in repr(client) and TOKEN not in caplog.text


def test_an_outage_in_the_middle_of_a_run_scores_zero_and_counts(reward_model_dir, tmp_path):
    server = RewardServer(reward_model_dir)
    try:
        zero = scorer_for(server.url + "/score", environ={}, token_env=None, on_failure="zero", max_retries=1)
        failing = scorer_for(server.url + "/score", environ={}, token_env=None, max_retries=1)
        first = zero.score(PROMPTS, COMPLETIONS, ANSWERS)
        assert all(score != 0.0 for score in first) and zero.failed_rows == 0
    finally:
        server.stop()  # the service goes down between two scoring calls
    assert zero.score(PROMPTS, COMPLETIONS, ANSWERS) == [0.0] * 5
    assert zero.counters() == {"failed_rows": 5.0}
    with pytest.raises(RewardError, match=r"reward service rm \(http://127.0.0.1:\d+/score\) is unreachable.*"
                                          r"after 2 tries.*on_failure is fail"):
        failing.score(PROMPTS, COMPLETIONS, ANSWERS)


def test_overloaded_service_is_retried_with_backoff_then_answers():
    service = ScriptedService(lambda body, call: (503, {"error": "busy"}) if call <= 2 else
                              (200, {"scores": [1.0] * len(body["prompts"])}))
    try:
        scores = scorer_for(service.url, max_retries=3).score(PROMPTS[:2], COMPLETIONS[:2], ANSWERS[:2])
    finally:
        service.stop()
    assert scores == [1.0, 1.0] and len(service.bodies) == 3
    assert service.bodies[-1] == {"prompts": PROMPTS[:2], "completions": COMPLETIONS[:2], "answers": ANSWERS[:2]}
    assert service.headers[-1]["Authorization"] == f"Bearer {TOKEN}"


def test_requests_in_flight_never_exceed_the_concurrency_limit():
    service = ScriptedService(lambda body, call: (200, {"scores": [0.5] * len(body["prompts"])}), delay=0.3)
    try:
        scores = scorer_for(service.url, batch_size=1, max_concurrency=2).score(PROMPTS, COMPLETIONS, ANSWERS)
    finally:
        service.stop()
    assert scores == [0.5] * 5 and len(service.bodies) == 5
    assert service.max_in_flight == 2


@pytest.mark.parametrize(("payload", "message"), [
    ({"scores": [1.0]}, r"returned 1 scores for the batch of rows 0-1 \(2 rows\), expected 2"),
    ({"scores": [1.0, math.nan]}, r"scored row 1 \(prompt '3\+4='\) nan, expected a finite number"),
    ({"scores": [1.0, "high"]}, r"scored row 1 \(prompt '3\+4='\) 'high', expected a finite number"),
    ({"score": 1.0}, r"answered a dict without a `scores` list for rows 0-1"),
    ("<html>oops</html>", r"answered something that is not JSON"),
])
def test_a_malformed_answer_names_the_service_and_the_row(payload, message):
    service = ScriptedService(lambda body, call: (200, payload))
    try:
        with pytest.raises(RewardError, match=r"reward service rm \(http://127.0.0.1:\d+\) " + message):
            scorer_for(service.url, on_failure="zero").score(PROMPTS[:2], COMPLETIONS[:2], ANSWERS[:2])
    finally:
        service.stop()
