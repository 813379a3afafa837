"""PPO and GRPO raise the checkable reward of the tiny addition task, with the KL to the reference bounded.

Both start from `rl_start_model` (briefly fine-tuned: the format is right, many sums are not) and
use the task's checker as the reward function. About 10 s each on 2 cores.
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import make_config
from trainer.online.stages import run_online_stage

OPTIONS = {
    "ppo": {"num_episodes": 25, "rollout_batch_size": 256, "mini_batch_size": 64, "kl_coef": 0.02,
            "critic_lr": 1e-3},
    "grpo": {"num_episodes": 25, "rollout_batch_size": 32, "num_generations": 8, "mini_batch_size": 64},
}


def episode_metrics(directory) -> list[dict]:
    lines = [json.loads(line) for line in (directory / "metrics.jsonl").read_text().splitlines()]
    return [line for line in lines if "episode/reward_mean" in line]


@pytest.mark.learning
@pytest.mark.parametrize("stage", ["ppo", "grpo"])
def test_online_stage_raises_checkable_reward(stage, tmp_path, rl_start_model, task_files):
    config = make_config(stage, tmp_path / stage, rl_start_model, task_files["prompts"], task_files["prompts"],
                         optimizer={"lr": 5e-4, "warmup_steps": 0, "scheduler": "constant"},
                         train={"micro_batch_size": 64}, generation={"max_new_tokens": 4, "temperature": 0.7},
                         reward={"function": "trainer.tiny.task:reward"}, **{stage: OPTIONS[stage]})
    metrics = run_online_stage(config).metrics

    episodes = episode_metrics(tmp_path / stage)
    rewards = [e["episode/reward_mean"] for e in episodes]
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert last > first + 0.1, rewards  # sampled responses got clearly better
    # Greedy answers (already the mode's best guesses) must not collapse while sampling sharpens.
    assert metrics["eval/reward"] >= metrics["eval/reward_before"] - 0.05, metrics
    assert max(e["episode/kl_to_ref"] for e in episodes) < 1.5, [e["episode/kl_to_ref"] for e in episodes]
