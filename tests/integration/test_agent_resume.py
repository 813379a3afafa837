"""Kill -9 in the middle of a multi-turn episode, resume, and end with the weights of an uninterrupted run."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.conftest import stage_dict
from tests.integration.trainer_process import (
    TrainerProcess,
    assert_identical,
    exported_weights,
    latest_step,
    run_trainer,
    write_config,
)
from trainer.tiny.agent_task import write_agent_task

ENVIRONMENT = {"ALIGNFLOW_ENVIRONMENTS": "marked_echo=tests.trainer.agents.environments:MarkedEchoEnvironment"}


def agent_config(output: Path, tiny_model: Path, prompts: Path) -> dict:
    return stage_dict("grpo", output, tiny_model, prompts, train={"micro_batch_size": 4},
                      generation={"max_new_tokens": 6, "temperature": 1.0, "stop": list("abcdefghijklmnop")},
                      reward={"function": "tiny_calculator"}, checkpoint={"save_interval": 1},
                      environment={"name": "marked_echo", "max_turns": 3, "max_total_tokens": 40},
                      grpo={"num_episodes": 4, "rollout_batch_size": 2, "num_generations": 2, "mini_batch_size": 4})


@pytest.mark.slow  # three trainer processes: about a minute on 2 busy cores
def test_kill_9_mid_episode_resumes_to_the_uninterrupted_weights(tmp_path, tiny_model):
    prompts = write_agent_task(tmp_path / "task", num_train=16, num_eval=4)["prompts"]
    marker = tmp_path / "steps"
    reference = tmp_path / "reference"
    code, stderr = run_trainer("grpo", write_config(tmp_path / "reference.yaml",
                                                    agent_config(reference, tiny_model, prompts)),
                               env={**ENVIRONMENT, "AGENT_TEST_MARKER": str(tmp_path / "reference-steps")})
    assert code == 0, stderr[-3000:]

    output = tmp_path / "out"
    config = write_config(tmp_path / "agent.yaml", agent_config(output, tiny_model, prompts))
    child = TrainerProcess("grpo", config, env={**ENVIRONMENT, "AGENT_TEST_MARKER": str(marker)})
    deadline = time.monotonic() + 240
    while not (output / "checkpoints" / "latest").exists() or latest_step(output / "checkpoints") < 2:
        assert time.monotonic() < deadline and child.process.poll() is None, child.stderr[-2000:]
        time.sleep(0.01)
    steps_at_checkpoint = len(marker.read_text().splitlines())
    while len(marker.read_text().splitlines()) == steps_at_checkpoint:  # the next episode's environment is stepping
        assert time.monotonic() < deadline and child.process.poll() is None, child.stderr[-2000:]
        time.sleep(0.001)
    child.kill()
    assert not (output / "model").exists()

    code, stderr = run_trainer("grpo", config, env={**ENVIRONMENT, "AGENT_TEST_MARKER": str(marker)})
    assert code == 0, stderr[-3000:]
    assert "resumed from" in stderr
    assert_identical(exported_weights(output), exported_weights(reference))
