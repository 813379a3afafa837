"""Interrupting `python -m trainer` the way a cluster does, and resuming.

SIGTERM (a pod eviction) mid-run: the step finishes, a checkpoint is written at the step reached,
the process exits 143 with one line, and the rerun ends with weights bit-identical to an
uninterrupted run. SIGKILL while a checkpoint is being written: the half-written checkpoint is
never used and the rerun is bit-identical too. Every stage stops on SIGTERM at a step (supervised)
or episode (online) boundary with a checkpoint; under torchrun a signal to one rank stops both at
the same step.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import stage_dict
from tests.integration.services import free_port
from tests.integration.trainer_process import (
    TrainerProcess,
    assert_identical,
    exported_weights,
    latest_step,
    run_trainer,
    write_config,
)

# 80 samples in micro-batches of 8: 10 steps an epoch, 30 in all.
MAX_STEPS = 30


def sft_config(output: Path, tiny_model: Path, task_files: dict, **updates) -> dict:
    return stage_dict("sft", output, tiny_model, task_files["sft_train"],
                      **{"train": {"max_epochs": 3, "micro_batch_size": 8, "log_interval": 1},
                         "checkpoint": {"save_interval": 5, "keep_last": 0}, **updates})


def train_steps_logged(output: Path) -> list[int]:
    records = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]
    return [record["step"] for record in records if "loss" in record]


@pytest.fixture(scope="module")
def reference(tmp_path_factory, tiny_model, task_files) -> dict:
    """The exported weights of an uninterrupted run (a subprocess, like every run they are compared with)."""
    directory = tmp_path_factory.mktemp("reference")
    config = write_config(directory / "sft.yaml", sft_config(directory / "out", tiny_model, task_files))
    code, stderr = run_trainer("sft", config)
    assert code == 0, stderr[-3000:]
    return exported_weights(directory / "out")


def test_sigterm_saves_the_step_reached_exits_143_and_resumes_bit_exact(tmp_path, tiny_model, task_files, reference):
    output = tmp_path / "out"
    config = write_config(tmp_path / "sft.yaml", sft_config(output, tiny_model, task_files))
    child = TrainerProcess("sft", config)
    child.wait_for(r"step 7/30 ")
    child.send(signal.SIGTERM)
    signalled = time.monotonic()
    code = child.wait(60)

    assert code == 143, child.stderr[-3000:]
    assert time.monotonic() - signalled < 20  # within the default grace period
    stopped_at = latest_step(output / "checkpoints")
    assert 7 <= stopped_at < MAX_STEPS
    assert f"stopped after step {stopped_at} (signal 15)" in child.stderr
    assert child.stderr.splitlines()[-1].startswith("Preempted: ")
    assert "Traceback" not in child.stderr
    assert not (output / "model").exists()
    assert train_steps_logged(output) == list(range(1, stopped_at + 1))

    code, stderr = run_trainer("sft", config)
    assert code == 0, stderr[-3000:]
    assert f"resumed from {output / 'checkpoints' / f'step-{stopped_at:08d}'}" in stderr
    assert_identical(exported_weights(output), reference)
    assert train_steps_logged(output) == list(range(1, MAX_STEPS + 1))  # continued from the checkpoint: each once


def test_kill_9_during_a_checkpoint_write_never_uses_it_and_resumes_bit_exact(tmp_path, tiny_model, task_files,
                                                                                reference):
    output, staging = tmp_path / "out", tmp_path / "tmp"
    staging.mkdir()
    config = write_config(tmp_path / "sft.yaml", sft_config(output, tiny_model, task_files,
                                                            checkpoint={"save_interval": 1, "keep_last": 2}))
    child = TrainerProcess("sft", config, env={"TMPDIR": str(staging)})
    child.wait_for(r"step 6/30 ")

    def saving() -> bool:
        return any(p.name.startswith("alignflow-checkpoint-") for p in staging.iterdir())

    deadline = time.monotonic() + 60
    while True:
        while not saving():  # a save is being written
            assert time.monotonic() < deadline and child.process.poll() is None, child.stderr[-2000:]
            time.sleep(0.0005)
        # Stopped, it cannot finish the save between this look and the kill (on a busy machine it did): a save
        # already over when the stop landed is let go, and the next step's is caught (one every step).
        child.send(signal.SIGSTOP)
        if saving():
            break
        child.send(signal.SIGCONT)
    child.kill()

    assert saving()  # killed mid-save
    durable = latest_step(output / "checkpoints")
    code, stderr = run_trainer("sft", config)
    assert code == 0, stderr[-3000:]
    assert f"resumed from {output / 'checkpoints' / f'step-{durable:08d}'}" in stderr
    assert_identical(exported_weights(output), reference)


def online_config(stage: str, output: Path, tiny_model: Path, task_files: dict) -> dict:
    options = {"num_episodes": 40, "rollout_batch_size": 4, "mini_batch_size": 4}
    if stage == "grpo":
        options["num_generations"] = 2
    return stage_dict(stage, output, tiny_model, task_files["prompts"], train={"micro_batch_size": 4},
                      generation={"max_new_tokens": 3}, reward={"function": "trainer.tiny.task:reward"},
                      checkpoint={"save_interval": 100}, **{stage: options})


@pytest.mark.parametrize("stage", ["rm", "grpo", pytest.param("dpo", marks=pytest.mark.slow),
                                   pytest.param("ppo", marks=pytest.mark.slow)])
def test_every_stage_stops_on_sigterm_with_a_checkpoint(stage, tmp_path, tiny_model, task_files):
    output = tmp_path / "out"
    if stage in ("rm", "dpo"):
        config = stage_dict(stage, output, tiny_model, task_files["pref_eval"],
                            train={"max_epochs": 3, "micro_batch_size": 8, "log_interval": 1})
        progress = r"step 3/"
    else:
        config = online_config(stage, output, tiny_model, task_files)
        progress = r"episode 2:"
    child = TrainerProcess(stage, write_config(tmp_path / "stage.yaml", config))
    child.wait_for(progress)
    child.send(signal.SIGTERM)
    code = child.wait(60)

    assert code == 143, child.stderr[-3000:]
    assert "Traceback" not in child.stderr
    state = json.loads((output / "checkpoints" / f"step-{latest_step(output / 'checkpoints'):08d}" /
                        "trainer_state.json").read_text())
    assert state["global_step"] > 0
    assert not (output / "model").exists()


def test_sigterm_to_one_torchrun_rank_stops_both_at_the_same_step(tmp_path, tiny_model, task_files):
    output = tmp_path / "out"
    config = write_config(tmp_path / "sft.yaml", sft_config(output, tiny_model, task_files,
                                                            train={"max_epochs": 6, "micro_batch_size": 4,
                                                                   "log_interval": 1},
                                                            parallel={"plugin": "ddp"}))
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
                f"--master_port={free_port()}", "-m", "trainer"]
    child = TrainerProcess("sft", config, command=torchrun)
    child.wait_for(r"step 4/")
    ranks = {int(p.environ().get("RANK", -1)): p for p in psutil.Process(child.process.pid).children(recursive=True)
             if "trainer" in " ".join(p.cmdline())}
    os.kill(ranks[1].pid, signal.SIGTERM)  # only rank 1 is told
    child.wait(120)

    stopped_at = latest_step(output / "checkpoints")
    directory = output / "checkpoints" / f"step-{stopped_at:08d}"
    assert json.loads((directory / "trainer_state.json").read_text())["global_step"] == stopped_at
    assert {p.name for p in directory.glob("rng-rank*")} == {"rng-rank0.safetensors", "rng-rank1.safetensors"}
    assert f"stopped after step {stopped_at} (signal 15)" in child.stderr  # rank 0 stopped there too
    assert not (output / "model").exists()
