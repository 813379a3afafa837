"""Every online estimator trains on multi-turn episodes unchanged: advantages, values and the loss only on model tokens."""

import dataclasses
import math

import pytest
import torch

from tests.conftest import make_config
from trainer.lifecycle.context import build_context
from trainer.online.stages import build_online_trainer
from trainer.tiny.agent_task import write_agent_task

ESTIMATORS = [("grpo", {"advantage_estimator": "grpo", "mask_truncated_completions": True}),
              ("grpo", {"advantage_estimator": "rloo", "beta": 0.1}),
              ("grpo", {"advantage_estimator": "reinforce_plus_plus"}),
              ("ppo", {})]


@pytest.fixture(scope="module")
def agent_files(tmp_path_factory):
    return write_agent_task(tmp_path_factory.mktemp("agent-task"), num_train=16, num_eval=4)


@pytest.mark.parametrize(("stage", "options"), ESTIMATORS, ids=["grpo", "rloo", "reinforce_plus_plus", "ppo"])
def test_estimators_consume_episodes_with_model_tokens_only(stage, options, tmp_path, tiny_model, agent_files):
    section = {"num_episodes": 1, "rollout_batch_size": 2, "mini_batch_size": 8, **options}
    if stage == "grpo":
        section["num_generations"] = 2
    config = make_config(stage, tmp_path / "run", tiny_model, agent_files["prompts"], train={"micro_batch_size": 8},
                         generation={"max_new_tokens": 6, "temperature": 1.0, "stop": ["}"]},
                         reward={"function": "tiny_calculator"}, data={"max_length": 32},
                         environment={"name": "tiny_calculator", "max_turns": 2, "max_total_tokens": 24},
                         **{stage: section})
    trainer = build_online_trainer(config, build_context(config))
    trainer.fit(num_episodes=1, num_collect_steps=1, num_update_steps=1)
    experience = trainer._experience
    off_action = experience.action_mask == 0
    assert (experience.advantages[off_action] == 0).all()
    if experience.values is not None:  # PPO's critic: values only where the model acted
        assert (experience.values[off_action] == 0).all()
    if experience.loss_mask is not None:
        assert (experience.loss_mask[off_action] == 0).all()
        truncated = experience.truncated.bool()
        if options.get("mask_truncated_completions"):
            assert (experience.loss_mask[truncated] == 0).all()
    assert experience.input_ids.shape[1] <= 32 + 24  # prompt + the episode's token budget
    assert all(math.isfinite(value) for value in trainer.last_metrics.values())
    assert len(trainer.samples) > 0 and torch.is_tensor(experience.truncated)


def test_the_asynchronous_explorer_runs_episodes(tmp_path, tiny_model, agent_files, monkeypatch):
    from trainer.asynchronous.buffer import QueueBuffer
    from trainer.asynchronous.explorer import Explorer

    monkeypatch.setenv("ALIGNFLOW_ENVIRONMENTS", "echo=tests.trainer.agents.environments:EchoEnvironment")
    config = make_config("grpo", tmp_path / "run", tiny_model, agent_files["prompts"], train={"micro_batch_size": 8},
                         generation={"max_new_tokens": 4, "temperature": 1.0, "stop": list("abcdefghijklmnop")},
                         reward={"function": "tiny_calculator"}, data={"max_length": 32},
                         environment={"name": "echo", "max_turns": 3, "max_total_tokens": 40},
                         grpo={"rollout_batch_size": 2, "num_generations": 2, "mini_batch_size": 4})
    explorer = Explorer(config, buffer=QueueBuffer())
    torch.manual_seed(0)
    experience = explorer.make_batch()
    turns_per_row = [int(((row[1:] == 1) & (row[:-1] == 0)).sum()) for row in experience.action_mask]  # (B,)
    assert max(turns_per_row) > 1  # episodes of several model turns, observation tokens between them
    off_action = experience.action_mask == 0
    assert (experience.behaviour_logps[off_action] == 0).all()  # staleness weights only on the model's tokens
    # The episodes' agent/* cross the buffer with the batch, and the trainer logs their mean over its batches.
    from trainer.asynchronous.buffer import decode_experience, encode_experience
    from trainer.asynchronous.verl.verl_trainer import agent_metrics

    received = decode_experience(encode_experience(experience), "batch-1")
    assert received.info["agent/turns_per_episode"] == sum(turns_per_row) / len(turns_per_row)
    other = dataclasses.replace(received, info={**received.info, "agent/turns_per_episode": 1.0})
    mean = agent_metrics([received, other])
    assert mean["agent/turns_per_episode"] == (received.info["agent/turns_per_episode"] + 1.0) / 2
    assert mean.keys() == {key for key in received.info if key.startswith("agent/")}


def test_python_m_trainer_evaluate_scores_episodes(tmp_path, tiny_model, agent_files):
    from trainer.config import build_config
    from trainer.online.evaluate import run_evaluation

    config = build_config("evaluate", {
        "output_dir": str(tmp_path / "eval"), "model": {"path": str(tiny_model)}, "baseline_path": str(tiny_model),
        "prompts_path": str(agent_files["eval_prompts"]), "reward": {"function": "tiny_calculator"},
        "generation": {"max_new_tokens": 8, "temperature": 0.0},
        "environment": {"name": "tiny_calculator", "max_turns": 2},
        "rollout": {"engine": "auto"}})  # chosen per model: hf, where vLLM is not installed
    metrics = run_evaluation(config)
    assert metrics["reward"] == metrics["baseline_reward"] == 0.0  # a random model never answers a product
    assert metrics["tool_calls_per_episode"] == metrics["valid_tool_call_fraction"] == 0.0  # nor calls the tool
    samples = (tmp_path / "eval" / "samples.jsonl").read_text().splitlines()
    assert len(samples) == 4  # one episode per held-out row, rendered for the report


def test_environment_section_is_strict_and_names_are_checked_at_start_up(tmp_path, tiny_model, agent_files):
    from trainer.config.environment import EnvironmentConfig
    from trainer.errors import ConfigError
    from trainer.rollout.multi_turn import Agent
    from trainer.tiny.model import build_tokenizer

    with pytest.raises(ConfigError, match="environment.max_turn"):
        make_config("grpo", tmp_path / "run", tiny_model, agent_files["prompts"], reward={"function": "tiny_calculator"},
                    environment={"name": "tools", "max_turn": 3})
    with pytest.raises(ConfigError, match="environment.tools is 'os:system', which is not an allowed tool"):
        Agent(EnvironmentConfig(name="tools", tools=["os:system"]), build_tokenizer())


def test_tool_call_validity_is_weighted_by_the_calls_each_episode_made():
    from trainer.online.evaluate import tool_call_counts

    # Four episodes with one call each, half of them failed; two with three calls each, none failed.
    counts = tool_call_counts([1, 1, 1, 1, 3, 3], [1, 0, 1, 0, 0, 0])
    assert counts == {"tool_calls_per_episode": 10 / 6, "valid_tool_call_fraction": (2 + 6) / 10}
    assert tool_call_counts([0, 0], [0, 0]) == {"tool_calls_per_episode": 0.0, "valid_tool_call_fraction": 0.0}


def test_over_sampled_prompts_are_consumed_whichever_groups_complete(tmp_path, tiny_model, agent_files):
    config = make_config("grpo", tmp_path / "run", tiny_model, agent_files["prompts"], train={"micro_batch_size": 8},
                         generation={"max_new_tokens": 6, "temperature": 1.0, "stop": ["}"]},
                         reward={"function": "tiny_calculator"}, data={"max_length": 32},
                         environment={"name": "tiny_calculator", "max_turns": 2, "max_total_tokens": 24,
                                      "schedule": "as_ready", "oversample_groups": 1},
                         grpo={"num_episodes": 1, "rollout_batch_size": 2, "num_generations": 2, "mini_batch_size": 4})
    trainer = build_online_trainer(config, build_context(config))
    trainer.fit(num_episodes=1, num_collect_steps=1, num_update_steps=1)
    assert len(trainer._experience) == 2 * 2  # the groups the update needs, whole
    assert trainer.prompts.position()["prompt_samples"] == 2 + 1  # the abandoned group's prompt too, never retried


def test_the_explorer_carries_unfinished_groups_to_the_next_weight_version(tmp_path, tiny_model, agent_files,
                                                                            monkeypatch):
    from tests.trainer.agents.carry import GATED, carry_config, run_carried_batches
    from trainer.algorithms.ppo import response_logps
    from trainer.asynchronous.buffer import QueueBuffer
    from trainer.asynchronous.explorer import Explorer

    monkeypatch.setenv("ALIGNFLOW_ENVIRONMENTS", GATED)
    explorer = Explorer(carry_config(tmp_path / "run", tiny_model, agent_files["prompts"]), buffer=QueueBuffer())
    torch.manual_seed(0)
    run = run_carried_batches(explorer, monkeypatch)  # group 0 ends in batch 1; group 1 is carried to batch 2
    first, second, carried = run.first, run.second, run.carried
    assert first.version == 0 and len(first) == 2
    assert first.info["agent/carried_over"] == 2.0 and first.info["agent/carried_episodes"] == 0.0
    assert all(any(values) for values in run.recorded)  # recorded under version 0, before the new weights
    # The batch is the carried group, recorded as sampled from version 0 on (its staleness counts from there).
    assert second.version == 0 and second.info["agent/carried_episodes"] == 2.0
    assert second.info["agent/carried_over"] == 4.0  # the two new groups, still waiting
    start = second.input_ids.shape[1] - max(len(e.ids) for e in carried)
    now = response_logps(explorer.policy, second.as_batch()) * second.action_mask  # version 1's
    for row, (ids, values) in enumerate(zip(run.turn_one, run.recorded)):
        assert second.input_ids[row, start:start + len(ids)].tolist() == ids  # the episode went on, not restarted
        old = slice(start, start + len(ids))
        assert torch.allclose(second.behaviour_logps[row, old], torch.tensor(values))  # version 0's, kept
        assert not torch.allclose(now[row, old], torch.tensor(values))  # which version 1 would not have given
        new = slice(start + len(ids), second.input_ids.shape[1])
        assert torch.allclose(second.behaviour_logps[row, new], now[row, new])  # the second turn: version 1's
    assert (second.action_mask[:, start + len(run.turn_one[0]):] == 1).any()  # there was a second turn to weigh

    third = explorer.make_batch(10)  # trained at version 9: groups from version 1 are too old to go on
    assert third.info["agent/stale_episodes_dropped"] == 4.0 and third.version == 1
    explorer.close()
