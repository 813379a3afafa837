"""Fault injection for the asynchronous mode: kill the trainer, the explorer, or both, at random points.

Each scenario runs real `python -m trainer grpo --mode ...` processes on the tiny model, kills them
with SIGKILL (or stops them with SIGTERM) at a step or batch picked by a seeded random generator,
reruns them, and then checks what a cluster operator cares about: the run ends with exit 0 and the
step count of an uninterrupted run, each trainer step is in the metrics once and trained on the
buffer batch of its own number (so no batch was lost, skipped or trained twice), no batch number
was written twice by any explorer, and every batch was garbage-collected once checkpoints covered it.

The default cases pick one kill point each; `test_random_kills_resume_exactly_once` (slow) repeats
kills at several random points per run over more seeds.
"""

from __future__ import annotations

import collections
import json
import os
import random
import re
import signal
import time
from pathlib import Path

import pytest

from tests.conftest import stage_dict
from tests.integration.trainer_process import TrainerProcess, error_lines, latest_step, write_config
from trainer.asynchronous.buffer import FileBuffer
from trainer.tiny.task import reward

TOTAL_STEPS = 8


def slow_reward(prompt: str, completion: str, answer: str | None) -> float:
    """The tiny task's reward, a quarter of a second late: the explorer paces the run (about a second a
    batch) as a real one would, so a kill point seen in the log lands before the run is over."""
    time.sleep(0.25)
    return reward(prompt, completion, answer)


def exploding_reward(prompt: str, completion: str, answer: str | None) -> float:
    """A reward function with a bug: the explorer that calls it fails."""
    raise ValueError("the reward service returned HTTP 500")


def async_config(tmp_path: Path, tiny_model: Path, task_files: dict, reward_function: str = "slow_reward") -> Path:
    config = stage_dict("grpo", tmp_path / "run", tiny_model, task_files["prompts"],
                        optimizer={"lr": 1e-3, "scheduler": "constant"}, train={"micro_batch_size": 8},
                        generation={"max_new_tokens": 3},
                        reward={"function": f"tests.integration.test_async_faults:{reward_function}"},
                        grpo={"rollout_batch_size": 2, "num_generations": 2, "mini_batch_size": 4},
                        asynchronous={"total_steps": TOTAL_STEPS, "sync_interval": 1, "sync_offset": 1,
                                      "save_interval": 2, "wait_timeout": 120})
    return write_config(tmp_path / "grpo.yaml", config)


def start(config: Path, mode: str) -> TrainerProcess:
    return TrainerProcess("grpo", config, "--mode", mode,
                          env={"ALIGNFLOW_ALLOWED_REWARD_MODULES": "tests.integration.test_async_faults"})


def is_running(pid: int) -> bool:
    """Whether `pid` is a live process (a zombie waiting to be reaped is not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def explorer_pid(run: Path, timeout: float = 60) -> int:
    """The pid of the explorer holding the buffer's lease."""
    lease = run / "buffer" / "lease.json"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            return json.loads(lease.read_text())["pid"]
        except (FileNotFoundError, ValueError, KeyError):
            time.sleep(0.1)
    raise AssertionError(f"no explorer lease at {lease}")


def kill_at(process: TrainerProcess, pattern: str, rng: random.Random, number: int = signal.SIGKILL) -> None:
    """Send `number` once a stderr line matches `pattern`, after a random fraction of a step."""
    process.wait_for(pattern)
    time.sleep(rng.uniform(0.0, 1.0))
    process.send(number)
    process.wait(120)


def assert_trained_exactly_once(run: Path, stderrs: list[str]) -> None:
    """Steps 1..TOTAL_STEPS once each, step n trained on batch n, no batch written twice, all collected."""
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [(line["step"], line["buffer/position"]) for line in lines if "loss" in line]
    assert steps == [(step, step) for step in range(1, TOTAL_STEPS + 1)], steps
    written = collections.Counter(int(n) for text in stderrs for n in re.findall(r"explorer wrote batch (\d+)", text))
    assert max(written.values()) == 1 and set(written) <= set(range(1, TOTAL_STEPS + 1)), written
    assert latest_step(run / "checkpoints") == TOTAL_STEPS
    assert (run / "model" / "model.safetensors").is_file()
    buffer = FileBuffer(run / "buffer")
    assert buffer.batch_numbers() == [] and buffer.discarded_through() == TOTAL_STEPS


def finish(*processes: TrainerProcess) -> None:
    for process in processes:
        code = process.wait(300)
        assert code == 0, process.stderr[-3000:]


def test_kill_9_and_sigterm_of_mode_both_take_the_explorer_along_and_the_rerun_trains_each_step_once(
        tmp_path, tiny_model, task_files):
    rng, run = random.Random(11), tmp_path / "run"
    config = async_config(tmp_path, tiny_model, task_files)

    first = start(config, "both")
    first.wait_for(r"trainer step 1:")
    child = explorer_pid(run)
    kill_at(first, rf"trainer step {rng.randint(1, 2)}:", rng)  # kill -9 of the parent only
    deadline = time.monotonic() + 5
    while is_running(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not is_running(child), "the explorer outlived its killed parent"

    second = start(config, "both")  # resumes; the explorer takes over the dead one's lease
    resumed = latest_step(run / "checkpoints") if (run / "checkpoints" / "latest").exists() else 0
    second.wait_for(rf"trainer step {rng.randint(resumed + 1, TOTAL_STEPS - 2)}:")
    second.send(signal.SIGTERM)  # ends the step in flight, if any, then stops
    second.wait(120)
    assert second.process.returncode == 143, second.stderr[-3000:]
    assert "Traceback" not in second.stderr
    reached = max(int(n) for n in re.findall(r"trainer step (\d+):", second.stderr))
    assert latest_step(run / "checkpoints") == reached  # a blocking checkpoint at the step reached
    assert not (run / "model").exists()
    assert not is_running(explorer_pid(run))

    third = start(config, "both")
    finish(third)
    assert_trained_exactly_once(run, [first.stderr, second.stderr, third.stderr])


def test_killing_the_explorer_or_the_trainer_alone_loses_and_repeats_nothing(tmp_path, tiny_model, task_files):
    rng, run = random.Random(7), tmp_path / "run"
    config = async_config(tmp_path, tiny_model, task_files)

    trainer, explorer = start(config, "train"), start(config, "explore")
    kill_at(explorer, rf"explorer wrote batch {rng.randint(1, 3)} ", rng)
    restarted_explorer = start(config, "explore")  # continues the numbering; takes over the dead one's lease
    kill_at(trainer, rf"trainer step {rng.randint(2, TOTAL_STEPS - 2)}:", rng)
    restarted_trainer = start(config, "train")  # reads the batch after its checkpoint's position
    finish(restarted_trainer, restarted_explorer)

    assert "explorer continues after batch" in restarted_explorer.stderr
    assert_trained_exactly_once(run, [explorer.stderr, restarted_explorer.stderr])


def test_a_failing_explorer_marks_the_buffer_failed_and_the_trainer_exits_with_one_line(tmp_path, tiny_model,
                                                                                        task_files):
    config = async_config(tmp_path, tiny_model, task_files, reward_function="exploding_reward")
    failed = start(config, "both")
    code = failed.wait(300)

    assert code == 2, failed.stderr[-3000:]
    *explorer_lines, line = error_lines(failed.stderr)  # the explorer child's own line, then the trainer's
    assert [text.split(":")[0] for text in explorer_lines] == ["RewardError"], explorer_lines
    assert line.startswith(f"ExplorerError: {tmp_path / 'run' / 'buffer' / 'FAILED'}: the explorer failed: "
                           "RewardError: "), line
    assert "HTTP 500" in line
    buffer = FileBuffer(tmp_path / "run" / "buffer")
    assert buffer.failure() is not None and not buffer.is_closed()  # failed, not "cleanly" closed
    assert not (tmp_path / "run" / "model").exists()


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("target", ["trainer", "explorer", "both", "explorer-of-both"])
def test_random_kills_resume_exactly_once(target, seed, tmp_path, tiny_model, task_files):
    rng, run = random.Random(seed), tmp_path / "run"
    config = async_config(tmp_path, tiny_model, task_files)
    stderrs: list[str] = []
    split = target != "explorer-of-both"
    trainer, explorer = (start(config, "train"), start(config, "explore")) if split else (start(config, "both"), None)
    for _ in range(rng.randint(1, 3)):
        # A point the restarted processes have yet to reach: a step after the checkpoint, a batch after the last.
        done = FileBuffer(run / "buffer").last_written() if target == "explorer" else (
            latest_step(run / "checkpoints") if (run / "checkpoints" / "latest").exists() else 0)
        if done + 1 > TOTAL_STEPS - 1:
            break
        step = rng.randint(done + 1, TOTAL_STEPS - 1)
        if target == "explorer-of-both":  # the child dies alone: the parent stops with one line, then reruns
            trainer.wait_for(rf"trainer step {step}:")
            os.kill(explorer_pid(run), signal.SIGKILL)
            assert trainer.wait(120) == 2 and "was killed by SIGKILL" in error_lines(trainer.stderr)[0]
            stderrs.append(trainer.stderr)
            trainer = start(config, "both")
            continue
        victims = {"trainer": [trainer], "explorer": [explorer], "both": [trainer, explorer]}[target]
        pattern = rf"explorer wrote batch {step} " if target == "explorer" else rf"trainer step {step}:"
        kill_at(victims[0], pattern, rng)
        for victim in victims[1:]:
            victim.send(signal.SIGKILL)
            victim.wait(60)
        if explorer in victims:
            stderrs.append(explorer.stderr)
            explorer = start(config, "explore")
        if trainer in victims:
            trainer = start(config, "train")
    finish(*[process for process in (trainer, explorer) if process is not None])
    stderrs.append(trainer.stderr if not split else explorer.stderr)
    assert_trained_exactly_once(run, stderrs)
