"""Each reward service is asked once when the stage starts, before the model loads: a service that does not answer
HTTP stops the run in one line naming its key and URL. Against real servers on loopback."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import make_config
from tests.trainer.rewards.servers import RawService, ScriptedService, free_port, json_reply
from trainer.config.rewards import ServiceConfig
from trainer.errors import RewardError
from trainer.rewards.service_client import ServiceClient
from trainer.rewards.weighted import build_weighted_scorer

FAST = {"max_retries": 1, "backoff_seconds": 0.01, "timeout_seconds": 0.5}


def client_for(url: str, **options) -> ServiceClient:
    return ServiceClient("rm", ServiceConfig(url=url, **{**FAST, **options}), "reward.sources.0.service", {})


def test_a_service_that_answers_http_is_reachable_whatever_the_status(reward_server):
    client_for(reward_server.url + "/score").check_reachable()  # the reference server: GET /score is 404
    post_only = ScriptedService(lambda body, call: (200, {}))
    try:
        client_for(post_only.url + "/v1").check_reachable()  # a judge route that takes only POST: 501
    finally:
        post_only.stop()
    assert post_only.bodies == []  # the probe posts nothing


def test_a_service_that_is_still_starting_is_waited_for():
    service = RawService(lambda number: json_reply({}, "503 Service Unavailable") if number <= 2 else
                         json_reply({}, "404 Not Found"))
    try:
        client_for(service.url + "/score", max_retries=3).check_reachable()
    finally:
        service.stop()
    assert service.connections == 3


@pytest.mark.parametrize(("reply", "reason"), [
    (None, "ConnectionRefusedError"),  # nothing listens on the port
    (b"SSH-2.0-OpenSSH_9.6\r\n", "BadStatusLine: SSH-2.0-OpenSSH_9.6"),  # the port of something that is not HTTP
    (b"", "RemoteDisconnected"),
])
def test_a_service_that_does_not_answer_http_is_one_line_naming_the_key(reply, reason):
    service = None if reply is None else RawService(lambda number: reply)
    url = f"http://127.0.0.1:{free_port()}/score" if service is None else service.url + "/score"
    try:
        with pytest.raises(RewardError) as error:
            client_for(url).check_reachable()
    finally:
        if service is not None:
            service.stop()
    message = str(error.value)
    assert message.startswith(f"reward.sources.0.service.url: reward service rm ({url}) is unreachable or broke off: "
                              f"{reason}")
    assert message.endswith("(after 2 tries over 0.0 s of waits); checked when the stage starts, before the model "
                            "loads")
    assert "\n" not in message


def test_building_the_stage_scorer_checks_each_service(tmp_path, tiny_model, task_files):
    dead = f"http://127.0.0.1:{free_port()}/v1"
    config = make_config("grpo", tmp_path, tiny_model, task_files["prompts"], reward={"sources": [
        {"kind": "math"},
        {"kind": "judge", "service": {"url": dead, **FAST, "on_failure": "zero"}, "judge": {"model": "m"}},
    ]})
    with pytest.raises(RewardError, match=r"^reward.sources.1.service.url: reward service judge \(http://127.0.0.1:"
                                          r"\d+/v1\) is unreachable or broke off: ConnectionRefusedError"):
        build_weighted_scorer(config, torch.device("cpu"))  # on_failure zero covers outages later, not a dead start
