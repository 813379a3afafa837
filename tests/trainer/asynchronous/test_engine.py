"""The experience-driven API as the seed's newer `trinity/trainer/trainer.py` writes it (which methods
are coroutines, which engine a config gets), and the `Trainer`'s reliability on the real engine and
the tiny model: exactly-once experience across a restart, an explorer's failure, SIGTERM, and
non-finite steps. (The processes of `--mode both` are in `tests/integration/test_async*.py`.)"""

import asyncio
import inspect
import json
import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import make_config
from trainer.asynchronous.buffer import ExplorerError, FileBuffer, QueueBuffer
from trainer.asynchronous.engine import TrainEngineWrapper, Trainer, get_trainer_wrapper
from trainer.asynchronous.explorer import Explorer
from trainer.asynchronous.synchronizer import Synchronizer
from trainer.errors import ConfigError, TrainingError
from trainer.lifecycle import preemption


def test_trainer_coroutines_and_plain_methods_follow_the_seed():
    for name in ("prepare", "train", "train_step", "need_sync", "sync_weight", "shutdown", "is_alive"):
        assert inspect.iscoroutinefunction(getattr(Trainer, name)), name
    for name in ("save_checkpoint", "need_save"):  # plain methods in the seed; save_checkpoint returns metrics
        assert not inspect.iscoroutinefunction(getattr(Trainer, name)), name
    assert inspect.signature(Trainer.save_checkpoint).parameters.keys() == {"self", "block_until_saved", "save_as_hf"}


def test_engine_wrapper_coroutines_and_plain_methods_follow_the_seed():
    for name in ("prepare", "train_step"):
        assert inspect.iscoroutinefunction(getattr(TrainEngineWrapper, name)), name
    for name in ("save_checkpoint", "sync_weight", "upload_state_dict", "save_state_dict"):
        assert not inspect.iscoroutinefunction(getattr(TrainEngineWrapper, name)), name
    assert isinstance(inspect.getattr_static(TrainEngineWrapper, "train_step_num"), property)


def test_only_online_stages_get_an_engine(tmp_path, tiny_model, task_files):
    config = make_config("sft", tmp_path, tiny_model, task_files["sft_train"])
    with pytest.raises(ConfigError, match="supports ppo and grpo"):
        get_trainer_wrapper(config)


# ---- exactly-once experience, failures, signals and non-finite steps on the real engine ------------------------
# The tiny model trains in this process; an `Explorer` on the same synchronizer makes the batches, and
# each test drives the `Trainer` step by step where it needs to look between steps.


def engine_config(tmp_path, tiny_model, task_files, **asynchronous):
    return make_config("grpo", tmp_path / "run", tiny_model, task_files["prompts"], train={"micro_batch_size": 8},
                       optimizer={"lr": 1e-3, "scheduler": "constant"}, generation={"max_new_tokens": 3},
                       reward={"function": "trainer.tiny.task:reward"},
                       grpo={"rollout_batch_size": 2, "num_generations": 2, "mini_batch_size": 4},
                       asynchronous={"total_steps": 6, "sync_interval": 1, "sync_offset": 1, "save_interval": 2,
                                     "max_staleness": 8, "wait_timeout": 5} | asynchronous)  # batches made up front


def metric_lines(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def trainer_state(run: Path, step: int) -> dict:
    return json.loads((run / "checkpoints" / f"step-{step:08d}" / "trainer_state.json").read_text())


@pytest.fixture
def signal_state():
    """Forget any signal a test sent itself, so later tests in this process do not see it."""
    yield
    preemption.install(grace_seconds=60)
    preemption.uninstall()


def test_batches_are_deleted_only_under_a_checkpoint_and_a_resumed_trainer_reads_the_next(tmp_path, tiny_model,
                                                                                          task_files):
    config = engine_config(tmp_path, tiny_model, task_files)
    directory, run = tmp_path / "run" / "buffer", tmp_path / "run"
    synchronizer, writer = Synchronizer(), FileBuffer(tmp_path / "run" / "buffer")
    explorer = Explorer(config, buffer=writer, synchronizer=synchronizer)

    async def step(trainer: Trainer) -> list[int]:
        explorer.refresh_weights(0)
        writer.put(explorer.make_batch())
        assert await trainer._run_step()
        trainer.engine.checkpoints.wait()  # a background save is durable now ...
        trainer._discard_covered()  # ... and its batches may go at the next step
        return FileBuffer(directory).batch_numbers()

    async def five_steps_then_killed() -> list[list[int]]:
        trainer = Trainer(config, buffer=FileBuffer(directory), synchronizer=synchronizer)
        try:
            await trainer.prepare()
            return [await step(trainer) for _ in range(5)]
        finally:
            await trainer.shutdown()  # no final save: step 5 is lost, as in a kill

    present = asyncio.run(five_steps_then_killed())
    # Checkpoints at steps 2 and 4. A batch goes once the checkpoint after the one covering it is
    # durable, so a resume falling back past a damaged latest checkpoint still finds its batches.
    assert present == [[1], [1, 2], [1, 2, 3], [3, 4], [3, 4, 5]]
    assert trainer_state(run, 4)["buffer_position"] == 4

    async def resumed() -> Trainer:
        trainer = Trainer(config, buffer=FileBuffer(directory), synchronizer=synchronizer)
        try:
            await trainer.prepare()
            assert trainer.train_step_num == 4 and trainer.buffer.position == 4
            explorer.refresh_weights(0)
            writer.put(explorer.make_batch())  # batch 6; batch 5 is still there from before the kill
            writer.close()
            assert await trainer.train() == "finished"
            return trainer
        finally:
            await trainer.shutdown()

    asyncio.run(resumed())
    steps = [line for line in metric_lines(run) if "loss" in line]
    assert [(line["step"], line["buffer/position"]) for line in steps] == [(s, s) for s in range(1, 7)]  # each once
    for line in steps:  # where each trainer step's time went (the explorer samples and scores: not here)
        assert line["perf/time/logps_old"] > 0 and line["perf/time/update"] > 0 and line["perf/time/generate"] == 0
        timed = sum(value for key, value in line.items() if key.startswith("perf/time/") and key != "perf/time/step")
        assert timed <= line["perf/time/step"] and line["perf/completions_per_second"] > 0
    assert FileBuffer(directory).batch_numbers() == [] and FileBuffer(directory).discarded_through() == 6
    assert (run / "model" / "model.safetensors").is_file()


def train_on_batches(config, num_batches: int, end: Callable[[QueueBuffer], None] = QueueBuffer.close) -> None:
    """Run a `Trainer` on `num_batches` batches an in-process explorer made up front, then `end(queue)`."""
    queue, synchronizer = QueueBuffer(), Synchronizer()
    explorer = Explorer(config, buffer=queue, synchronizer=synchronizer)

    async def train() -> None:
        trainer = Trainer(config, buffer=queue, synchronizer=synchronizer)
        try:
            await trainer.prepare()
            explorer.refresh_weights(0)
            for _ in range(num_batches):
                queue.put(explorer.make_batch())
            end(queue)
            await trainer.train()
        finally:
            await trainer.shutdown()

    asyncio.run(train())


def test_an_explorer_failure_stops_the_trainer_after_a_checkpoint_of_its_steps(tmp_path, tiny_model, task_files):
    config = engine_config(tmp_path, tiny_model, task_files)
    with pytest.raises(ExplorerError, match="the explorer failed: RewardError: the reward function raised"):
        train_on_batches(config, 3, lambda queue: queue.fail("RewardError: the reward function raised"))
    assert trainer_state(tmp_path / "run", 3)["buffer_position"] == 3  # the three steps trained are kept
    assert not (tmp_path / "run" / "model").exists()  # a failed run is not exported


def test_sigterm_stops_the_trainer_at_a_step_boundary_with_a_checkpoint(tmp_path, tiny_model, task_files,
                                                                        signal_state):
    config = engine_config(tmp_path, tiny_model, task_files)
    queue, synchronizer = QueueBuffer(), Synchronizer()
    explorer = Explorer(config, buffer=queue, synchronizer=synchronizer)

    async def train() -> str:
        trainer = Trainer(config, buffer=queue, synchronizer=synchronizer)
        try:
            await trainer.prepare()
            explorer.refresh_weights(0)
            for _ in range(3):
                queue.put(explorer.make_batch())
            assert await trainer._run_step()
            os.kill(os.getpid(), signal.SIGTERM)  # what Kubernetes sends; recorded, not fatal
            return await trainer.train()
        finally:
            await trainer.shutdown()

    assert asyncio.run(train()) == "preempted"
    assert preemption.stopped_by_signal() and preemption.exit_code() == 143
    assert (tmp_path / "run" / "checkpoints" / "latest").read_text().strip() == "step-00000001"
    assert trainer_state(tmp_path / "run", 1)["buffer_position"] == 1
    assert not (tmp_path / "run" / "model").exists()


def corrupted(experience):
    # NaN behaviour log-probs make NaN importance weights, so a NaN loss (NaN scores would not: GRPO
    # gives a group without a finite spread zero advantages).
    experience.behaviour_logps = torch.full_like(experience.behaviour_logps, float("nan"))
    return experience


@pytest.mark.parametrize("num_bad", [1, 2])
def test_non_finite_steps_are_skipped_and_counted_and_too_many_in_a_row_fail(num_bad, tmp_path, tiny_model,
                                                                             task_files):
    config = engine_config(tmp_path, tiny_model, task_files, total_steps=3, save_interval=0)
    config.train.max_nonfinite_steps = 1
    queue, synchronizer = QueueBuffer(), Synchronizer()
    explorer = Explorer(config, buffer=queue, synchronizer=synchronizer)

    async def train() -> str:
        trainer = Trainer(config, buffer=queue, synchronizer=synchronizer)
        try:
            await trainer.prepare()
            explorer.refresh_weights(0)
            for index in range(3):
                batch = explorer.make_batch()
                queue.put(corrupted(batch) if index < num_bad else batch)
            return await trainer.train()
        finally:
            await trainer.shutdown()

    run = tmp_path / "run"
    if num_bad == 2:  # more than train.max_nonfinite_steps in a row: one line, nothing exported
        with pytest.raises(TrainingError, match=r"step 2: 2 optimizer steps in a row .*max_nonfinite_steps is 1"):
            asyncio.run(train())
        assert not (run / "model").exists()
        return
    assert asyncio.run(train()) == "finished"
    steps = [line for line in metric_lines(run) if "loss" in line]
    assert [line["nonfinite"] for line in steps] == [1, 0, 0]
    assert [line["train/nonfinite_skipped"] for line in steps] == [1, 1, 1]
    weights = load_file(run / "model" / "model.safetensors")
    assert all(torch.isfinite(tensor).all() for tensor in weights.values())
