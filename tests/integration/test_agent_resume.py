"""Kill -9 in the middle of a multi-turn episode and resume: under `lockstep`, to the weights of an uninterrupted run
bit for bit; under `as_ready` (whose sampled episodes depend on timing), with the interrupted rollout redone on its
prompts and no prompt trained twice."""

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


def agent_config(output: Path, tiny_model: Path, prompts: Path, schedule: str) -> dict:
    return stage_dict("grpo", output, tiny_model, prompts, train={"micro_batch_size": 4},
                      generation={"max_new_tokens": 6, "temperature": 1.0, "stop": list("abcdefghijklmnop")},
                      reward={"function": "tiny_calculator"}, checkpoint={"save_interval": 1},
                      environment={"name": "marked_echo", "max_turns": 3, "max_total_tokens": 40,
                                   "schedule": schedule},
                      grpo={"num_episodes": 4, "rollout_batch_size": 2, "num_generations": 2, "mini_batch_size": 4})


def rollout_prompts(marker: Path) -> list[list[str]]:
    """The prompts each rollout started, in order (a rollout starts its 2 x 2 episodes together)."""
    starts = [line for line in marker.read_text().splitlines() if line.startswith("start ")]
    return [starts[i:i + 4] for i in range(0, len(starts), 4)]


def steps(marker: Path) -> int:
    return marker.read_text().splitlines().count("step")


@pytest.mark.parametrize("schedule", ["lockstep", "as_ready"])
def test_kill_9_mid_episode_resumes_without_losing_or_repeating_an_episode(tmp_path, tiny_model, schedule):
    prompts = write_agent_task(tmp_path / "task", num_train=16, num_eval=4)["prompts"]
    if schedule == "lockstep":  # exact: the resumed run must end with the uninterrupted run's weights
        reference = tmp_path / "reference"
        code, stderr = run_trainer("grpo", write_config(tmp_path / "reference.yaml",
                                                        agent_config(reference, tiny_model, prompts, schedule)),
                                   env={**ENVIRONMENT, "AGENT_TEST_MARKER": str(tmp_path / "reference-steps")})
        assert code == 0, stderr[-3000:]

    output, killed, resumed = tmp_path / "out", tmp_path / "killed-steps", tmp_path / "resumed-steps"
    config = write_config(tmp_path / "agent.yaml", agent_config(output, tiny_model, prompts, schedule))
    child = TrainerProcess("grpo", config, env={**ENVIRONMENT, "AGENT_TEST_MARKER": str(killed)})
    deadline = time.monotonic() + 240
    while not (output / "checkpoints" / "latest").exists() or latest_step(output / "checkpoints") < 2:
        assert time.monotonic() < deadline and child.process.poll() is None, child.stderr[-2000:]
        time.sleep(0.01)
    steps_at_checkpoint = steps(killed)
    while steps(killed) == steps_at_checkpoint:  # the next rollout's environments are stepping
        assert time.monotonic() < deadline and child.process.poll() is None, child.stderr[-2000:]
        time.sleep(0.001)
    child.kill()
    assert not (output / "model").exists()
    checkpoint = latest_step(output / "checkpoints")

    code, stderr = run_trainer("grpo", config, env={**ENVIRONMENT, "AGENT_TEST_MARKER": str(resumed)})
    assert code == 0, stderr[-3000:]
    assert "resumed from" in stderr
    # No episode lost, none trained twice: the killed rollout (the one after the checkpoint) is run again on the
    # same prompts, and the rollouts after it take the prompts that follow, under either schedule.
    before, after = rollout_prompts(killed), rollout_prompts(resumed)
    assert len(before) == checkpoint + 1 and len(after) == 4 - checkpoint
    assert after[0] == before[checkpoint]
    trained = [prompt for rollout in before[:checkpoint] + after for prompt in rollout[::2]]  # one per group
    assert len(set(trained)) == len(trained) == 8
    if schedule == "lockstep":
        assert_identical(exported_weights(output), exported_weights(reference))
