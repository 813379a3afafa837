"""The experience-driven Trainer with an explorer in a separate process (or a thread).

Experience flows through a file buffer, weight versions advance and the explorer loads them, the
run ends cleanly when the explorer stops, and a stalled producer ends in a timeout, not a hang.
PPO with a critic runs through the same engine; stale batches are importance-corrected, and
rejected beyond `asynchronous.max_staleness`.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from tests.conftest import stage_dict
from trainer.asynchronous.buffer import QueueBuffer
from trainer.asynchronous.engine import Trainer
from trainer.asynchronous.explorer import Explorer
from trainer.asynchronous.synchronizer import Synchronizer
from trainer.asynchronous.weights import latest_version
from trainer.config import build_config
from trainer.errors import WaitTimeout

REPO = Path(__file__).parents[2]


def async_config(tmp_path, model, prompts, **asynchronous) -> dict:
    return stage_dict("grpo", tmp_path / "run", model, prompts, optimizer={"lr": 5e-4, "scheduler": "constant"},
                      train={"micro_batch_size": 16}, generation={"max_new_tokens": 4, "temperature": 0.7},
                      reward={"function": "trainer.tiny.task:reward"},
                      grpo={"rollout_batch_size": 8, "num_generations": 2, "mini_batch_size": 16},
                      asynchronous={"total_steps": 4, "sync_interval": 1, "sync_offset": 1, "wait_timeout": 60}
                      | asynchronous)


def ppo_async_config(tmp_path, model, prompts, **asynchronous) -> dict:
    return stage_dict("ppo", tmp_path / "run", model, prompts, optimizer={"lr": 5e-4, "scheduler": "constant"},
                      train={"micro_batch_size": 8}, generation={"max_new_tokens": 4, "temperature": 0.7},
                      reward={"function": "trainer.tiny.task:reward"},
                      ppo={"rollout_batch_size": 8, "mini_batch_size": 8, "critic_lr": 1e-3},
                      asynchronous={"total_steps": 3, "sync_interval": 1, "sync_offset": 1, "wait_timeout": 60}
                      | asynchronous)


def metric_lines(directory: Path) -> list[dict]:
    return [json.loads(line) for line in (directory / "metrics.jsonl").read_text().splitlines()]


def trainer_command(config_path: Path, mode: str, *overrides: str, stage: str = "grpo") -> list[str]:
    sets = [item for override in overrides for item in ("--set", override)]
    return [sys.executable, "-m", "trainer", stage, "--config", str(config_path), "--mode", mode, *sets]


def run(command: list[str], timeout: int = 240) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def test_trainer_and_explorer_exchange_experience_and_weights(tmp_path, rl_start_model, task_files):
    config_path = tmp_path / "grpo.yaml"
    config_path.write_text(yaml.safe_dump(async_config(tmp_path, rl_start_model, task_files["prompts"],
                                                       save_interval=3)))

    done = run(trainer_command(config_path, "both"))

    assert done.returncode == 0, done.stderr[-3000:]
    output = tmp_path / "run"
    assert latest_version(output / "weights") == 4  # one version per trainer step
    loaded = [int(v) for v in re.findall(r"explorer loaded weight version (\d+)", done.stderr)]
    assert loaded[0] == 0 and max(loaded) >= 2, loaded  # the explorer picked up new versions
    written = re.findall(r"explorer wrote batch (\d+) with weight version (\d+)", done.stderr)
    # Bounded staleness: batch i (1-based) is generated with version >= i - 1 - sync_offset.
    assert all(int(version) >= int(batch) - 2 for batch, version in written), written
    assert (output / "model" / "model.safetensors").is_file()
    assert (output / "checkpoints" / "latest").read_text().strip() == "step-00000004"
    steps = metric_lines(output)
    assert [line["step"] for line in steps] == [1, 2, 3, 4]  # one line per step, a checkpoint's save time in it
    assert all("loss" in line for line in steps) and "time/save_checkpoint" in steps[2]  # saved at step 3
    # Every batch carried its behaviour log-probs and was importance-corrected; a batch one version
    # old (sync_offset 1) gets weights that differ from 1 but stay near it on this small update.
    assert all(0.5 < line["staleness/importance_weight"] < 1.5 for line in steps), steps
    assert max(line["staleness/max"] for line in steps) <= 1 and steps[-1]["staleness/rejected"] == 0


def test_ppo_with_a_critic_trains_asynchronously_end_to_end(tmp_path, rl_start_model, task_files):
    config_path = tmp_path / "ppo.yaml"
    config_path.write_text(yaml.safe_dump(ppo_async_config(tmp_path, rl_start_model, task_files["prompts"])))

    done = run(trainer_command(config_path, "both", stage="ppo"))

    assert done.returncode == 0, done.stderr[-3000:]
    output = tmp_path / "run"
    assert latest_version(output / "weights") == 3
    checkpoint = output / "checkpoints" / "step-00000003"
    assert (output / "checkpoints" / "latest").read_text().strip() == checkpoint.name
    assert {"actor.pt", "critic.pt"} <= {p.name for p in checkpoint.iterdir()}  # one checkpoint, both roles
    steps = [line for line in metric_lines(output) if "loss" in line]
    assert len(steps) == 3
    assert all("value_loss" in line and "critic/grad_norm" in line and "critic/values/mean" in line for line in steps)
    # The exported critic is the final checkpoint's, and its backbone moved away from the policy's
    # weights it started from (critic_model_path and reward.model_path are unset).
    final_head = torch.load(checkpoint / "critic.pt", weights_only=True)["head.weight"]
    torch.testing.assert_close(load_file(output / "critic" / "value_head.safetensors")["head.weight"], final_head)
    start = load_file(rl_start_model / "model.safetensors")
    critic = load_file(output / "critic" / "model.safetensors")
    shared = [key for key in critic if f"model.{key}" in start]
    assert shared and any(not torch.equal(critic[key], start[f"model.{key}"]) for key in shared)
    assert (output / "model" / "model.safetensors").is_file()


def test_trainer_ends_cleanly_when_the_explorer_stops_early(tmp_path, rl_start_model, task_files):
    config_path = tmp_path / "grpo.yaml"
    config_path.write_text(yaml.safe_dump(async_config(tmp_path, rl_start_model, task_files["prompts"],
                                                       total_steps=6)))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    trainer = subprocess.Popen(trainer_command(config_path, "train"), cwd=REPO, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # An explorer told to stop after 3 batches closes the buffer; the trainer wants 6.
    explorer = run(trainer_command(config_path, "explore", "asynchronous.total_steps=3"))
    _, trainer_err = trainer.communicate(timeout=240)

    assert explorer.returncode == 0, explorer.stderr[-3000:]
    assert trainer.returncode == 0, trainer_err[-3000:]
    assert "closed the buffer after 3 steps" in trainer_err
    assert (tmp_path / "run" / "checkpoints" / "latest").read_text().strip() == "step-00000003"
    assert (tmp_path / "run" / "model" / "config.json").is_file()


def test_stalled_producer_ends_in_a_timeout_error(tmp_path, rl_start_model, task_files):
    config = build_config("grpo", async_config(tmp_path, rl_start_model, task_files["prompts"], wait_timeout=2))

    async def train_without_explorer():
        trainer = Trainer(config)
        try:
            await trainer.prepare()
            await trainer.train()
        finally:
            await trainer.shutdown()

    started = time.monotonic()
    with pytest.raises(WaitTimeout, match="no experience for 2 s"):
        asyncio.run(train_without_explorer())
    assert time.monotonic() - started < 60


def test_explorer_without_trainer_ends_in_a_timeout_error(tmp_path, rl_start_model, task_files):
    config = build_config("grpo", async_config(tmp_path, rl_start_model, task_files["prompts"], wait_timeout=1))
    with pytest.raises(WaitTimeout, match="not published"):
        Explorer(config).run()


def test_trainer_and_explorer_thread_share_a_queue_and_an_in_process_synchronizer(tmp_path, rl_start_model,
                                                                                    task_files):
    config = build_config("grpo", async_config(tmp_path, rl_start_model, task_files["prompts"], total_steps=3))
    queue, synchronizer = QueueBuffer(), Synchronizer()
    explorer = Explorer(config, buffer=queue, synchronizer=synchronizer)
    thread = threading.Thread(target=explorer.run, daemon=True)

    async def train() -> int:
        trainer = Trainer(config, buffer=queue, synchronizer=synchronizer)
        try:
            await trainer.prepare()
            thread.start()  # after version 0 is uploaded
            await trainer.train()
            return trainer.train_step_num
        finally:
            await trainer.shutdown()

    assert asyncio.run(train()) == 3
    thread.join(timeout=60)
    assert explorer.version >= 1  # the explorer thread loaded a newer version than the first
    assert synchronizer.latest_version == 3
    assert not (tmp_path / "run" / "weights").exists()  # the memory channel, not the weights directory


def test_a_batch_older_than_max_staleness_is_rejected_and_counted(tmp_path, rl_start_model, task_files):
    # sync_interval 1 and sync_offset 0: the explorer protocol only produces fresh batches, so the
    # limit is 0. Three batches of weight version 0: the first trains (step 1, version 1), the other
    # two are then one version old and are dropped; the buffer closes and the run ends after 1 step.
    config = build_config("grpo", async_config(tmp_path, rl_start_model, task_files["prompts"], total_steps=2,
                                               sync_offset=0, max_staleness=0))
    queue, synchronizer = QueueBuffer(), Synchronizer()
    explorer = Explorer(config, buffer=queue, synchronizer=synchronizer)

    async def train() -> Trainer:
        trainer = Trainer(config, buffer=queue, synchronizer=synchronizer)
        try:
            await trainer.prepare()
            explorer.refresh_weights(0)
            for _ in range(3):
                queue.put(explorer.make_batch())
            queue.close()
            await trainer.train()
            return trainer
        finally:
            await trainer.shutdown()

    trainer = asyncio.run(train())
    assert trainer.train_step_num == 1 and trainer.num_rejected == 2
    (line,) = metric_lines(tmp_path / "run")  # one line per step: the rejections after step 1 are merged into it
    assert line["step"] == 1 and line["staleness/max"] == 0 and line["staleness/rejected"] == 2



def test_ppo_trainer_resumes_actor_critic_and_step_from_its_checkpoint(tmp_path, rl_start_model, task_files):
    config = build_config("ppo", ppo_async_config(tmp_path, rl_start_model, task_files["prompts"], total_steps=3))
    synchronizer, queue = Synchronizer(), QueueBuffer()
    explorer = Explorer(config, buffer=queue, synchronizer=synchronizer)

    async def two_steps_then_preempted() -> Trainer:
        # The Trainer's own API, step by step: two steps and a checkpoint, then the process "dies"
        # (no final save, no export) before the third.
        trainer = Trainer(config, buffer=queue, synchronizer=synchronizer)
        try:
            await trainer.prepare()
            for _ in range(2):
                explorer.refresh_weights(trainer.train_step_num)
                queue.put(explorer.make_batch())
                await trainer.train_step(await trainer._sample_data({}))
                assert await trainer.need_sync()
                assert "time/sync_weight" in await trainer.sync_weight()  # the seed's newer API: metrics back
            assert trainer.save_checkpoint(block_until_saved=True).keys() == {"time/save_checkpoint"}
            return trainer
        finally:
            await trainer.shutdown()

    first = asyncio.run(two_steps_then_preempted())
    saved_critic = torch.load(tmp_path / "run" / "checkpoints" / "step-00000002" / "critic.pt", weights_only=True)

    synchronizer = Synchronizer()
    resumed = Trainer(config, buffer=QueueBuffer(), synchronizer=synchronizer)
    try:
        asyncio.run(resumed.prepare())
        engine = resumed.engine
        assert resumed.train_step_num == 2 == first.train_step_num
        assert synchronizer.latest_version == 2  # the explorer continues from the trainer's weights
        torch.testing.assert_close(engine.critic_wg.module.state_dict(), saved_critic)
        assert engine.actor_rollout_wg.actor.num_optimizer_steps == first.engine.actor_rollout_wg.actor.num_optimizer_steps
        assert engine.kl_controller.value == first.engine.kl_controller.value
    finally:
        asyncio.run(resumed.shutdown())
