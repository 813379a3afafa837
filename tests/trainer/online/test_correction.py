"""The colocated loop's rollout correction: no change when engine and trainer agree, weights when they differ."""

from __future__ import annotations

import json
import math

import pytest
import torch

from tests.conftest import make_config
from trainer.lifecycle.context import build_context, close_context
from trainer.online.stages import build_online_trainer, run_online_stage


def grpo_config(directory, model, prompts, **rollout):
    return make_config("grpo", directory, model, prompts, train={"micro_batch_size": 8, "log_interval": 1},
                       generation={"max_new_tokens": 4, "temperature": 1.0}, reward={"function": "tiny_addition"},
                       rollout=rollout, optimizer={"lr": 1e-3, "warmup_steps": 0},
                       grpo={"num_episodes": 2, "rollout_batch_size": 4, "num_generations": 4, "mini_batch_size": 8,
                             "beta": 0.0})


def metrics_lines(directory) -> list[dict]:
    return [json.loads(line) for line in (directory / "metrics.jsonl").read_text().splitlines()]


def test_correction_forced_on_with_hf_changes_nothing(tmp_path, rl_start_model, task_files):
    plain = run_online_stage(grpo_config(tmp_path / "plain", rl_start_model, task_files["prompts"]))
    corrected = run_online_stage(grpo_config(tmp_path / "corrected", rl_start_model, task_files["prompts"],
                                             correction={"enabled": True, "mode": "token_truncate", "clip_max": 2.0}))
    for name, value in plain.actor.state_dict().items():
        torch.testing.assert_close(corrected.actor.state_dict()[name], value, rtol=0, atol=1e-6, msg=name)
    steps = [m for m in metrics_lines(tmp_path / "corrected") if "rollout_correction/kl" in m]
    assert len(steps) == 2  # one per collect step
    for step in steps:  # the hf engine is the trainer's own forward: every ratio is exactly 1
        assert step["rollout_correction/kl"] == 0.0 and step["rollout_correction/clipped_fraction"] == 0.0
        assert step["rollout_correction/ratio_min"] == step["rollout_correction/ratio_max"] == 1.0
    assert not any("rollout_correction/kl" in m for m in metrics_lines(tmp_path / "plain"))


@pytest.fixture
def trainer(tmp_path, rl_start_model, task_files):
    config = grpo_config(tmp_path / "t", rl_start_model, task_files["prompts"],
                         correction={"enabled": True, "mode": "sequence_mask", "clip_max": 1.5})
    context = build_context(config)
    yield build_online_trainer(config, context)
    close_context(context)


def test_engine_logprobs_that_differ_weight_and_mask_the_loss(trainer):
    torch.manual_seed(0)
    batch, scores = trainer.rollout(trainer.prompts.take(4))
    mask = batch["action_mask"].float()
    from trainer.algorithms.ppo import response_logps

    trainer_logps = response_logps(trainer.actor, batch) * mask
    # An engine whose log-probs of row 0's tokens sum to 1 nat below the trainer's (sequence ratio e > 1.5:
    # masked) and of row 1's to 0.2 nat above (ratio e^-0.2: kept with that weight); other rows agree.
    behaviour = trainer_logps.clone()
    behaviour[0] -= 1.0 * mask[0] / mask[0].sum()
    behaviour[1] += 0.2 * mask[1] / mask[1].sum()
    experience = trainer.annotate({**batch, "behaviour_logps": behaviour}, scores)
    weights = experience.importance_weights
    assert torch.all(weights[0][mask[0] > 0] == 0)
    torch.testing.assert_close(weights[1][mask[1] > 0], torch.full_like(weights[1][mask[1] > 0], math.exp(-0.2)))
    torch.testing.assert_close(weights[2:], torch.ones_like(weights[2:]))  # agreeing rows and all padding: 1
