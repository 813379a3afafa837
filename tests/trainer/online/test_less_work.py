"""Work the online loop leaves out because it cannot change the result: the reference model without a KL
term, the old-log-prob forward of an exactly on-policy update, and logits over prompt positions."""

from __future__ import annotations

import copy

import pytest
import torch

from tests.conftest import make_config
from trainer.algorithms.online.registry import online_algorithm
from trainer.algorithms.ppo import response_logps
from trainer.lifecycle.context import build_context, close_context
from trainer.online.stages import build_online_trainer


def online_config(stage, tmp_path, model, prompts, **options):
    base = {"num_episodes": 1, "rollout_batch_size": 2, "mini_batch_size": 8}
    if stage == "grpo":
        base |= {"num_generations": 4, "beta": 0.0}
    else:
        base |= {"rollout_batch_size": 8, "kl_coef": 0.0}
    return make_config(stage, tmp_path / stage, model, prompts, train={"micro_batch_size": 8},
                       generation={"max_new_tokens": 6}, reward={"function": "trainer.tiny.task:reward"},
                       **{stage: base | options})


@pytest.fixture
def build(tmp_path, rl_start_model, task_files):
    contexts = []

    def build_trainer(stage, **options):
        config = online_config(stage, tmp_path, rl_start_model, task_files["prompts"], **options)
        contexts.append(build_context(config))
        return build_online_trainer(config, contexts[-1])

    yield build_trainer
    for context in contexts:
        close_context(context)


@pytest.mark.parametrize(("stage", "options", "expected"), [
    ("grpo", {"beta": 0.0}, False), ("grpo", {"beta": 0.04}, True),
    ("ppo", {"kl_coef": 0.0}, False), ("ppo", {"kl_coef": 0.05}, True),
    ("ppo", {"kl_coef": 0.0, "target_kl": 0.1}, True),  # a KL target reads the KL to the reference
])
def test_a_reference_is_needed_only_with_a_kl_term(stage, options, expected, tmp_path, tiny_model, task_files):
    config = online_config(stage, tmp_path, tiny_model, task_files["prompts"], **options)
    assert online_algorithm(config).needs_reference is expected


@pytest.mark.parametrize(("options", "expected"), [
    ({}, True),  # 2 prompts x 4 generations = 8 rows, one minibatch of 8, one epoch: one step per rollout
    ({"mini_batch_size": 4}, False),  # two steps: the second runs on updated weights
    ({"num_update_epochs": 2}, False),
    ({"num_collect_steps": 2}, False),  # 16 rows in minibatches of 8
])
def test_exactly_on_policy_means_one_optimizer_step_per_episode(options, expected, tmp_path, tiny_model, task_files):
    config = online_config("grpo", tmp_path, tiny_model, task_files["prompts"], **options)
    assert online_algorithm(config).is_exactly_on_policy() is expected


def test_beta_zero_loads_no_reference_and_skips_the_old_logprob_forward(build):
    trainer = build("grpo")
    assert trainer.ref_model is None
    torch.manual_seed(0)
    experience = trainer._make_experience(0)
    assert experience.old_logps is None and experience.ref_logps is None
    assert experience.advantages is not None


@pytest.mark.parametrize("options", [{"beta": 0.04}, {"mini_batch_size": 4}])
def test_old_logprobs_are_computed_when_a_reference_or_a_later_step_needs_them(build, options):
    trainer = build("grpo", **options)
    torch.manual_seed(0)
    experience = trainer._make_experience(0)
    assert experience.old_logps is not None
    assert (experience.ref_logps is not None) is ("beta" in options)


def snapshot(trainer):
    return copy.deepcopy((trainer.actor.state_dict(), trainer.actor_optimizer.state_dict(),
                          trainer.actor_scheduler.state_dict()))


def restore(trainer, state):
    for part, part_state in zip((trainer.actor, trainer.actor_optimizer, trainer.actor_scheduler), state):
        part.load_state_dict(part_state)


@pytest.mark.parametrize("stage", ["grpo", "ppo"])
def test_the_skipped_old_logprob_forward_gives_the_same_loss_gradients_and_step(stage, build):
    trainer = build(stage)
    torch.manual_seed(0)
    experience = trainer._make_experience(0)
    assert experience.old_logps is None
    mask = experience.action_mask.float()
    with torch.no_grad():  # the forward the on-policy path leaves out, as `annotate` runs it otherwise
        explicit = copy.copy(experience)
        explicit.old_logps = response_logps(trainer.actor, experience.as_batch()) * mask
    assert experience.advantages.abs().sum() > 0  # the step moves the weights

    objective = trainer.algorithm.build_actor_objective()
    outputs, gradients = [], []
    for batch in (experience.as_batch(), explicit.as_batch()):
        trainer.actor.zero_grad()
        output = objective(trainer.actor, batch)
        output.total.backward()
        outputs.append(output)
        gradients.append([p.grad.clone() for p in trainer.actor.parameters() if p.grad is not None])
    torch.testing.assert_close(outputs[0].total, outputs[1].total)
    for key in outputs[0].stats:
        torch.testing.assert_close(outputs[0].stats[key], outputs[1].stats[key])
    assert len(gradients[0]) == len(gradients[1]) > 0
    for skipped, explicit_gradient in zip(*gradients):
        torch.testing.assert_close(skipped, explicit_gradient)
    trainer.actor.zero_grad()

    before = snapshot(trainer)
    metrics = trainer.learn_minibatch(experience)  # one optimizer step, as the loop takes it
    stepped = copy.deepcopy(trainer.actor.state_dict())
    restore(trainer, before)
    explicit_metrics = trainer.learn_minibatch(explicit)
    for key, value in trainer.actor.state_dict().items():
        torch.testing.assert_close(stepped[key], value)
    assert not torch.equal(stepped["lm_head.weight"], before[0]["lm_head.weight"])
    assert metrics["loss"] == pytest.approx(explicit_metrics["loss"], abs=1e-6)


def test_logprobs_from_response_positions_only_equal_the_full_forward(build):
    trainer = build("grpo")
    torch.manual_seed(0)
    batch = trainer._make_experience(0).as_batch()
    prompt_width = int(batch["action_mask"].any(0).long().argmax())
    assert prompt_width > 1  # the prompt's logits are left out
    logps, entropy = response_logps(trainer.actor, batch, with_entropy=True)
    full_batch = {k: v for k, v in batch.items() if k != "action_mask"}  # no mask: every position is scored
    full_logps, full_entropy = response_logps(trainer.actor, full_batch, with_entropy=True)
    mask = batch["action_mask"].bool()
    torch.testing.assert_close(logps[mask], full_logps[mask])
    torch.testing.assert_close(entropy[mask], full_entropy[mask])
    assert not logps[:, :prompt_width].any()  # prompt positions are not computed
