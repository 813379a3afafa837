"""The experience-driven Trainer with an explorer in a separate process.

Experience flows through a file buffer, weight versions advance and the explorer loads them, the
run ends cleanly when the explorer stops, and a stalled producer ends in a timeout, not a hang.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import stage_dict
from trainer.asynchronous.buffer import QueueBuffer
from trainer.asynchronous.engine import Trainer
from trainer.asynchronous.explorer import Explorer
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


def trainer_command(config_path: Path, mode: str, *overrides: str) -> list[str]:
    sets = [item for override in overrides for item in ("--set", override)]
    return [sys.executable, "-m", "trainer", "grpo", "--config", str(config_path), "--mode", mode, *sets]


def run(command: list[str], timeout: int = 240) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def test_trainer_and_explorer_exchange_experience_and_weights(tmp_path, rl_start_model, task_files):
    config_path = tmp_path / "grpo.yaml"
    config_path.write_text(yaml.safe_dump(async_config(tmp_path, rl_start_model, task_files["prompts"])))

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


def test_trainer_and_explorer_thread_share_an_in_process_queue(tmp_path, rl_start_model, task_files):
    config = build_config("grpo", async_config(tmp_path, rl_start_model, task_files["prompts"], total_steps=3))
    queue = QueueBuffer()
    explorer = Explorer(config, buffer=queue)
    thread = threading.Thread(target=explorer.run, daemon=True)

    async def train() -> int:
        trainer = Trainer(config, buffer=queue)
        try:
            await trainer.prepare()
            thread.start()  # after version 0 is published
            await trainer.train()
            return trainer.train_step_num
        finally:
            await trainer.shutdown()

    assert asyncio.run(train()) == 3
    thread.join(timeout=60)
    assert explorer.version >= 1  # the explorer thread loaded a newer version than the first
