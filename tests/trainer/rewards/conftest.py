"""One reference reward server (with a bearer token) for the module tests of remote sources, and the sandbox
service for `code_tests`."""

from __future__ import annotations

import pytest

from tests.trainer.rewards.servers import RewardServer, write_reward_model
from tests.trainer.sandbox.conftest import sandbox_service  # noqa: F401 (the sandbox service, for code_tests)

TOKEN = "s3cr3t-reward-token-0123456789"


@pytest.fixture(scope="session")
def reward_model_dir(tmp_path_factory, tiny_model):
    directory = tmp_path_factory.mktemp("reward-model")
    write_reward_model(tiny_model, directory)
    return directory


@pytest.fixture(scope="session")
def reward_server(reward_model_dir, tmp_path_factory):
    server = RewardServer(reward_model_dir, token=TOKEN, log=tmp_path_factory.mktemp("server-log") / "server.log")
    yield server
    server.stop()
