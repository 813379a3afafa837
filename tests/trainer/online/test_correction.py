"""The colocated loop's rollout correction: no change when engine and trainer agree, weights when they differ."""

from __future__ import annotations

import copy
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
    # `auto` without vLLM installed (this environment) chooses hf, and with it the correction's default: off.
    plain = run_online_stage(grpo_config(tmp_path / "plain", rl_start_model, task_files["prompts"], engine="auto"))
    params = json.loads((tmp_path / "plain" / "params.json").read_text())
    assert params["rollout"]["engine"] == "auto" and params["rollout.chosen_engine"] == "hf"
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
    batch, scores = trainer.collect(trainer.prompts.take(4))
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


def test_exactly_on_policy_the_correction_is_taken_in_the_update_and_gives_the_same_step(tmp_path, rl_start_model,
                                                                                        task_files):
    """One optimizer step on the whole rollout: the trainer's log-probs come from the update's forward, not a
    forward of their own, and the step, its loss and the logged statistics equal those of the separate pass."""
    config = grpo_config(tmp_path / "t", rl_start_model, task_files["prompts"],
                         correction={"enabled": True, "mode": "sequence_mask", "clip_max": 1.5})
    config.grpo.rollout_batch_size = 2  # 2 prompts x 4 = 8 rows, one minibatch of 8: exactly on-policy
    context = build_context(config)
    try:
        trainer = build_online_trainer(config, context)
        torch.manual_seed(0)
        batch, scores = trainer.collect(trainer.prompts.take(2))
        mask = batch["action_mask"].float()
        from trainer.algorithms.ppo import response_logps

        behaviour = response_logps(trainer.actor, batch).detach() * mask
        behaviour[0] -= 1.0 * mask[0] / mask[0].sum()  # masked: sequence ratio e > 1.5
        behaviour[1] += 0.2 * mask[1] / mask[1].sum()  # weighted by e^-0.2
        start = (copy.deepcopy(trainer.actor.state_dict()), copy.deepcopy(trainer.actor_optimizer.state_dict()),
                 copy.deepcopy(trainer.actor_scheduler.state_dict()))

        in_update = trainer.annotate({**batch, "behaviour_logps": behaviour}, scores)
        assert in_update.old_logps is None and in_update.importance_weights is None  # no forward of its own
        fused = trainer.learn_minibatch(in_update)
        fused_weights = {name: value.clone() for name, value in trainer.actor.state_dict().items()}

        trainer.actor.load_state_dict(start[0])
        trainer.actor_optimizer.load_state_dict(start[1])
        trainer.actor_scheduler.load_state_dict(start[2])
        trainer.correction_in_update = None  # the separate pass: old log-probs, then `correct_rollout`
        separate = trainer.annotate({**batch, "behaviour_logps": behaviour}, scores)
        assert separate.old_logps is not None and (separate.importance_weights[0][mask[0] > 0] == 0).all()
        plain = trainer.learn_minibatch(separate)
    finally:
        close_context(context)
    assert fused["loss"] == pytest.approx(plain["loss"], abs=1e-6) and fused["loss"] != 0
    assert fused["grad_norm"] == pytest.approx(plain["grad_norm"], rel=1e-5)
    for name, value in trainer.actor.state_dict().items():
        torch.testing.assert_close(fused_weights[name], value, rtol=0, atol=1e-5, msg=name)
    logged = [m for m in metrics_lines(tmp_path / "t") if "rollout_correction/kl" in m]
    assert len(logged) == 2  # the update's, then the separate pass's
    for key in ("kl", "clipped_fraction", "ratio_min", "ratio_max", "weight_mean"):
        assert logged[0][f"rollout_correction/{key}"] == pytest.approx(logged[1][f"rollout_correction/{key}"],
                                                                       abs=1e-6), key
    assert logged[0]["rollout_correction/clipped_fraction"] == pytest.approx(1 / 8)  # row 0 of 8 masked
