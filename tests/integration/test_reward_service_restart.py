"""Issue 45, reward services: a GRPO run (`python -m trainer`, as a pod runs it) scored by the reference reward
server rides out a kill -9 of the server and its restart 30 s later at the default retry budget, and ends with
the weights of an uninterrupted run; a service that stays down ends the run with one line, not a traceback."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from tests.conftest import stage_dict
from tests.integration.trainer_process import (
    TrainerProcess,
    assert_identical,
    error_lines,
    exported_weights,
    run_trainer,
    write_config,
)
from tests.trainer.rewards.servers import RewardServer, free_port, write_reward_model

TOKEN = "restart-test-token-0123456789"
ENV = {"ALIGNFLOW_TEST_RM_TOKEN": TOKEN}


@pytest.fixture(scope="module")
def reward_model_dir(tmp_path_factory, tiny_model) -> Path:
    directory = tmp_path_factory.mktemp("restart-rm")
    write_reward_model(tiny_model, directory)
    return directory


def grpo_config(output: Path, tiny_model: Path, prompts: Path, url: str, **service) -> dict:
    source = {"kind": "remote", "name": "rm", "service": {"url": url, "token_env": "ALIGNFLOW_TEST_RM_TOKEN",
                                                          **service}}
    return stage_dict("grpo", output, tiny_model, prompts, train={"micro_batch_size": 8},
                      generation={"max_new_tokens": 4}, reward={"sources": [source]},
                      grpo={"num_episodes": 8, "rollout_batch_size": 4, "num_generations": 2, "mini_batch_size": 8})


def scored_requests(server: RewardServer) -> int:
    try:
        return server.health()["requests"]["score"]
    except OSError:
        return 0


@pytest.mark.slow  # two trainer runs and a 30 s outage: about two minutes on 2 busy cores
@pytest.mark.timeout(900)
def test_a_reward_server_restarted_30_s_later_is_ridden_out_at_the_defaults(tmp_path, tiny_model, task_files,
                                                                             reward_model_dir):
    port = free_port()
    url = f"http://127.0.0.1:{port}/score"
    server = RewardServer(reward_model_dir, token=TOKEN, port=port)
    try:
        reference = tmp_path / "reference"
        code, stderr = run_trainer("grpo", write_config(tmp_path / "reference.yaml", grpo_config(
            reference, tiny_model, task_files["prompts"], url)), env=ENV)
        assert code == 0, stderr[-3000:]
        uninterrupted = scored_requests(server)

        output = tmp_path / "out"
        child = TrainerProcess("grpo", write_config(tmp_path / "out.yaml", grpo_config(
            output, tiny_model, task_files["prompts"], url)), env=ENV)
        while scored_requests(server) == uninterrupted:  # the run's first collect step has been scored
            assert child.process.poll() is None, child.stderr[-3000:]
            time.sleep(0.01)
        server.kill()
        killed_at = time.monotonic()
        restarted: list[RewardServer] = []
        restart = threading.Timer(30, lambda: restarted.append(RewardServer(reward_model_dir, token=TOKEN, port=port)))
        restart.start()
        code = child.wait(timeout=600)
        restart.join()
        server = restarted[0]
        assert code == 0, child.stderr[-3000:]
        assert time.monotonic() - killed_at > 30  # the run outlived the outage
        assert scored_requests(server) > 0  # and went on scoring with the restarted server
    finally:
        server.stop()
    assert "is unreachable or broke off" in child.stderr and "retrying in" in child.stderr  # the outage hit it
    assert_identical(exported_weights(output), exported_weights(reference))


@pytest.mark.timeout(600)
def test_a_reward_server_that_stays_down_ends_the_run_in_one_line(tmp_path, tiny_model, task_files, reward_model_dir):
    port = free_port()
    url = f"http://127.0.0.1:{port}/score"
    server = RewardServer(reward_model_dir, token=TOKEN, port=port)
    try:
        child = TrainerProcess("grpo", write_config(tmp_path / "out.yaml", grpo_config(
            tmp_path / "out", tiny_model, task_files["prompts"], url, max_retries=2, backoff_seconds=0.1)), env=ENV)
        while scored_requests(server) == 0:
            assert child.process.poll() is None, child.stderr[-3000:]
            time.sleep(0.01)
    finally:
        server.kill()
    code = child.wait(timeout=300)
    assert code == 2, child.stderr[-3000:]
    assert "Traceback" not in child.stderr
    assert error_lines(child.stderr)[-1].startswith(f"RewardError: reward service rm ({url}) is unreachable or "
                                                    f"broke off: ")
    assert error_lines(child.stderr)[-1].endswith("(after 3 tries over 0.3 s of waits); on_failure is fail, so the "
                                                  "run stops")
    assert TOKEN not in child.stderr
