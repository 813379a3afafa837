"""Done-when of issue 31: GRPO on the tiny task learns from a weighted sum of the checker, a format reward
and a reward model served over HTTP by the reference server, and logs each component.

The reward model is trained here (a short `rm` stage from `rl_start_model` on the task's preference
pairs) and served by `python -m trainer.rewards.server` on loopback with a bearer token, which the
trainer reads from the environment (the way a Kubernetes Secret arrives).
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import make_config
from tests.trainer.rewards.servers import RewardServer
from trainer.online.stages import run_online_stage
from trainer.supervised.stages import run_stage

TOKEN = "integration-secret-token-42"


@pytest.fixture(scope="module")
def served_reward_model(tmp_path_factory, rl_start_model, task_files):
    output = tmp_path_factory.mktemp("rm")
    run_stage(make_config("rm", output, rl_start_model, task_files["pref_train"], None,
                          optimizer={"lr": 1e-3, "warmup_steps": 5}, train={"max_epochs": 3, "micro_batch_size": 16}))
    server = RewardServer(output / "model", token=TOKEN, log=output / "server.log")
    yield server
    server.stop()


@pytest.mark.learning
@pytest.mark.timeout(1800)  # an rm stage, a server start and 45 GRPO episodes: 22 s on a quiet machine
def test_grpo_learns_from_checker_format_and_remote_reward_model(tmp_path, monkeypatch, served_reward_model,
                                                                 rl_start_model, task_files):
    monkeypatch.setenv("ALIGNFLOW_TEST_RM_TOKEN", TOKEN)
    sources = [
        {"kind": "function", "name": "tiny_addition", "weight": 1.0},
        {"kind": "format", "name": "number", "pattern": r"\s*\d{1,2}\s*", "weight": 0.1},
        # The reward model's scores are logits (several units wide): a small weight keeps the checker in charge.
        {"kind": "remote", "name": "rm", "weight": 0.02,
         "service": {"url": served_reward_model.url + "/score", "token_env": "ALIGNFLOW_TEST_RM_TOKEN",
                     "batch_size": 64, "max_concurrency": 2}},
    ]
    before = served_reward_model.health()["requests"]["score"]
    config = make_config("grpo", tmp_path / "grpo", rl_start_model, task_files["prompts"], None,
                         optimizer={"lr": 5e-4, "warmup_steps": 0, "scheduler": "constant"},
                         train={"micro_batch_size": 64}, generation={"max_new_tokens": 4, "temperature": 0.7},
                         reward={"sources": sources},
                         grpo={"num_episodes": 45, "rollout_batch_size": 32, "num_generations": 8,
                               "mini_batch_size": 64})
    run_online_stage(config)

    lines = [json.loads(line) for line in (tmp_path / "grpo" / "metrics.jsonl").read_text().splitlines()]
    steps = [line for line in lines if "rewards/tiny_addition/mean" in line]
    assert len(steps) == 45  # one per collect step
    for name in ("tiny_addition", "number", "rm"):
        assert all(f"rewards/{name}/mean" in s and f"rewards/{name}/std" in s for s in steps), name
    assert steps[-1]["rewards/rm/failed_rows"] == 0
    checker = [s["rewards/tiny_addition/mean"] for s in steps]
    # The sums got better. Sharing the advantage with two more sources slows the checker's gain, and how much
    # it gains in 30 episodes moved with the CPU's rounding (+0.00 to +0.16 over 2 seeds x 3 ATen kernel sets). In
    # 45 it gained +0.09 to +0.32 over 3 seeds x 3 kernel sets, so +0.05 has margin
    # (benchmarks/tiny_preset.md, "In-suite learning tests").
    assert sum(checker[-5:]) / 5 > sum(checker[:5]) / 5 + 0.05, checker
    # The episode's score is the weighted sum of the three components (one collect step per episode).
    episodes = [line["episode/reward_mean"] for line in lines if "episode/reward_mean" in line]
    expected = [s["rewards/tiny_addition/mean"] + 0.1 * s["rewards/number/mean"] + 0.02 * s["rewards/rm/mean"]
                for s in steps]
    assert episodes == pytest.approx(expected, abs=1e-4)
    assert served_reward_model.health()["requests"]["score"] - before == 45 * 4  # 256 rows in batches of 64
    assert TOKEN not in (tmp_path / "grpo" / "metrics.jsonl").read_text()
