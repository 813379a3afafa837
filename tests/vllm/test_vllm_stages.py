"""The vLLM engine where sampling happens: the colocated GRPO loop (it learns like `hf`, and a resumed run
samples what an uninterrupted one did), the explorer (behaviour log-probs from the engine), and
`python -m trainer evaluate` (the same scores as `hf`, greedy).

Runs only in the vLLM environment (`make test-vllm`); elsewhere the module is skipped.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("vllm", reason="vLLM runs in its own environment: make test-vllm")

import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from tests.conftest import make_config  # noqa: E402
from trainer.algorithms.ppo import response_logps  # noqa: E402
from trainer.asynchronous.buffer import QueueBuffer  # noqa: E402
from trainer.asynchronous.explorer import Explorer  # noqa: E402
from trainer.asynchronous.synchronizer import Synchronizer  # noqa: E402
from trainer.config import EvaluateConfig  # noqa: E402
from trainer.online.evaluate import run_evaluation  # noqa: E402
from trainer.online.stages import run_online_stage  # noqa: E402
from trainer.rollout.vllm_engine import VLLMEngine  # noqa: E402

GRPO = {"num_episodes": 25, "rollout_batch_size": 32, "num_generations": 8, "mini_batch_size": 64}


def grpo_config(directory, model, task_files, engine, /, **updates):
    options = {"optimizer": {"lr": 5e-4, "warmup_steps": 0, "scheduler": "constant"},
               "train": {"micro_batch_size": 64}, "generation": {"max_new_tokens": 4, "temperature": 0.7},
               "reward": {"function": "trainer.tiny.task:reward"}, "rollout": {"engine": engine}, "grpo": GRPO}
    for key, value in updates.items():
        options[key] = {**options.get(key, {}), **value}
    return make_config("grpo", directory, model, task_files["prompts"], task_files["prompts"], **options)


def episode_rewards(directory) -> list[float]:
    lines = [json.loads(line) for line in (directory / "metrics.jsonl").read_text().splitlines()]
    return [line["episode/reward_mean"] for line in lines if "episode/reward_mean" in line]


@pytest.mark.parametrize("engine", ["vllm", "hf"])
def test_grpo_raises_the_checkable_reward_with_either_engine(engine, tmp_path, vllm_start_model, task_files):
    metrics = run_online_stage(grpo_config(tmp_path / engine, vllm_start_model, task_files, engine)).metrics

    rewards = episode_rewards(tmp_path / engine)
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert last > first + 0.1, rewards  # sampled responses got clearly better
    assert metrics["eval/reward"] >= metrics["eval/reward_before"] - 0.05, metrics  # greedy answers held up


def test_a_resumed_vllm_run_samples_and_trains_what_an_uninterrupted_one_did(tmp_path, vllm_start_model, task_files):
    short = {"num_episodes": 3, "rollout_batch_size": 8, "num_generations": 4, "mini_batch_size": 32}
    whole = grpo_config(tmp_path / "whole", vllm_start_model, task_files, "vllm", grpo=short,
                        data={"eval_path": None})
    run_online_stage(whole)
    split = grpo_config(tmp_path / "split", vllm_start_model, task_files, "vllm", grpo=short,
                        data={"eval_path": None}, checkpoint={"save_interval": 1})
    run_online_stage(split, stop_after_episodes=1)
    run_online_stage(split)  # resumes after episode 1, sampling episodes 2 and 3 from the restored generator

    assert episode_rewards(tmp_path / "split")[-2:] == episode_rewards(tmp_path / "whole")[-2:]
    trained = [load_file(directory / "model" / "model.safetensors") for directory in (tmp_path / "whole",
                                                                                      tmp_path / "split")]
    assert all(torch.equal(trained[0][name], trained[1][name]) for name in trained[0])


def test_a_lora_grpo_run_that_pushes_its_adapter_trains_what_the_merged_push_trains(tmp_path, vllm_start_model,
                                                                                     task_files, caplog):
    """`rollout.vllm.lora_sync: adapter` through a whole stage: the same episodes and weights as `merged`."""
    short = {"num_episodes": 3, "rollout_batch_size": 8, "num_generations": 4, "mini_batch_size": 32}
    runs = {}
    for mode in ("merged", "adapter"):
        config = grpo_config(tmp_path / mode, vllm_start_model, task_files, "vllm", grpo=short,
                             data={"eval_path": None}, optimizer={"lr": 1e-2},
                             model={"lora": {"r": 4, "alpha": 8}}, rollout={"vllm": {"lora_sync": mode}})
        with caplog.at_level("INFO", logger="trainer.rollout.vllm_engine"):
            run_online_stage(config)
        runs[mode] = episode_rewards(tmp_path / mode), load_file(tmp_path / mode / "model" / "model.safetensors")
        assert ("pushes the LoRA adapter alone" in caplog.text) == (mode == "adapter")
        caplog.clear()

    (merged_rewards, merged), (adapter_rewards, adapter) = runs["merged"], runs["adapter"]
    assert adapter_rewards == merged_rewards
    assert all(torch.allclose(adapter[name], merged[name], atol=1e-6) for name in merged)


def test_the_explorer_records_the_engines_log_probs_as_behaviour_log_probs(tmp_path, vllm_start_model, task_files):
    config = make_config("grpo", tmp_path / "run", vllm_start_model, task_files["prompts"],
                         train={"micro_batch_size": 8}, generation={"max_new_tokens": 4},
                         reward={"function": "trainer.tiny.task:reward"}, rollout={"engine": "vllm"},
                         grpo={"rollout_batch_size": 4, "num_generations": 4, "mini_batch_size": 16},
                         asynchronous={"total_steps": 2, "sync_interval": 1, "sync_offset": 1, "wait_timeout": 5})
    synchronizer, buffer = Synchronizer(), QueueBuffer()
    explorer = Explorer(config, buffer=buffer, synchronizer=synchronizer)
    try:
        assert isinstance(explorer.rollout.engine, VLLMEngine)
        state = {name: tensor.clone() for name, tensor in explorer.policy.state_dict().items()}
        with torch.no_grad():
            state["lm_head.weight"] += 0.05 * torch.randn_like(state["lm_head.weight"])  # a trainer's new version
        synchronizer.set_model_state_dict(state, 0)
        explorer.run(1)
    finally:
        explorer.rollout.close()
    batch = buffer.get(1)

    assert batch.version == 0
    mask = batch.action_mask.bool()
    trainer_logps = response_logps(explorer.policy, batch.as_batch()) * batch.action_mask  # version 0's weights
    assert (batch.behaviour_logps - trainer_logps).abs().max() < 1e-4  # vLLM sampled with the pushed version
    assert (batch.behaviour_logps[mask] < 0).all()


def test_evaluate_scores_what_hf_scores(tmp_path, vllm_start_model, vllm_tiny_model, task_files):
    metrics = {}
    for engine in ("vllm", "hf"):
        config = EvaluateConfig(output_dir=str(tmp_path / engine), model={"path": str(vllm_start_model)},
                                baseline_path=str(vllm_tiny_model), prompts_path=str(task_files["eval_prompts"]),
                                reward={"function": "trainer.tiny.task:reward"},
                                generation={"max_new_tokens": 4, "temperature": 0.0}, rollout={"engine": engine})
        metrics[engine] = run_evaluation(config)

    assert metrics["vllm"] == metrics["hf"]
    assert metrics["vllm"]["reward"] > metrics["vllm"]["baseline_reward"]  # the fine-tuned model knows some sums
    samples = (tmp_path / "vllm" / "samples.jsonl").read_text()
    assert samples == (tmp_path / "hf" / "samples.jsonl").read_text()
