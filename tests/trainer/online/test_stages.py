"""The online stages on OLTrainer: exact resume of actor, critic and prompt position."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import make_config
from trainer.online.prompts import PromptStream
from trainer.online.stages import run_online_stage


def online_config(stage, output, model, prompts, **updates):
    options = {"num_episodes": 4, "rollout_batch_size": 8, "mini_batch_size": 8}
    if stage == "grpo":
        options |= {"num_generations": 2, "rollout_batch_size": 4}
    return make_config(stage, output, model, prompts, optimizer={"lr": 1e-3, "scheduler": "constant"},
                       train={"micro_batch_size": 8}, generation={"max_new_tokens": 4},
                       reward={"function": "trainer.tiny.task:reward"}, **{stage: options | updates})


@pytest.mark.parametrize("stage", ["ppo", "grpo"])
def test_resume_mid_run_gives_identical_actor_and_critic(stage, tmp_path, rl_start_model, task_files):
    # The start model gets some sums right, so rewards differ and every episode changes the weights.
    run_online_stage(online_config(stage, tmp_path / "straight", rl_start_model, task_files["prompts"]))
    run_online_stage(online_config(stage, tmp_path / "resumed", rl_start_model, task_files["prompts"]),
                     stop_after_episodes=2)
    assert not (tmp_path / "resumed" / "model").exists()
    run_online_stage(online_config(stage, tmp_path / "resumed", rl_start_model, task_files["prompts"]))
    start = load_file(rl_start_model / "model.safetensors")
    trained = load_file(tmp_path / "straight" / "model" / "model.safetensors")
    assert not torch.equal(start["lm_head.weight"], trained["lm_head.weight"])

    parts = ["model", "critic"] if stage == "ppo" else ["model"]
    for part in parts:
        name = "model.safetensors"
        straight = load_file(tmp_path / "straight" / part / name)
        resumed = load_file(tmp_path / "resumed" / part / name)
        for key in straight:
            assert torch.equal(straight[key], resumed[key]), f"{part}/{key}"
    if stage == "ppo":
        straight_head = load_file(tmp_path / "straight" / "critic" / "value_head.safetensors")
        resumed_head = load_file(tmp_path / "resumed" / "critic" / "value_head.safetensors")
        assert all(torch.equal(straight_head[k], resumed_head[k]) for k in straight_head)


def test_prompt_stream_resumes_at_the_same_prompt():
    rows = [{"prompt": str(i)} for i in range(10)]
    stream = PromptStream(rows, world_size=1, rank=0, seed=3)
    stream.take(7)
    position = stream.position()
    expected = stream.take(8)  # crosses into the second pass

    resumed = PromptStream(rows, world_size=1, rank=0, seed=3)
    resumed.restore(position["prompt_epoch"], position["prompt_samples"])
    assert resumed.take(8) == expected


def test_prompt_stream_reshuffles_each_pass():
    rows = [{"prompt": str(i)} for i in range(10)]
    stream = PromptStream(rows, world_size=1, rank=0, seed=0)
    first, second = stream.take(10), stream.take(10)
    assert sorted(r["prompt"] for r in first) == sorted(r["prompt"] for r in second)
    assert first != second
