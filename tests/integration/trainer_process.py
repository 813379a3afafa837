"""`python -m trainer` as a child process the tests can watch, signal and kill, as a cluster would."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch
import yaml
from safetensors.torch import load_file

REPO_ROOT = Path(__file__).resolve().parents[2]


def trainer_env(**extra: str) -> dict[str, str]:
    """The test process's environment for one trainer process (one thread, no torchrun variables)."""
    env = {key: value for key, value in os.environ.items() if key not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    return {**env, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO_ROOT), **extra}


def write_config(path: Path, config: dict) -> Path:
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


class TrainerProcess:
    """A running `python -m trainer <stage> --config <config> [args]` whose stderr is collected line by line.

    Args:
        stage: The stage to run.
        config: Path of the stage config.
        args: Extra command-line arguments.
        env: Extra environment variables.
        command: Replaces `python -m trainer` (e.g. torchrun).
    """

    def __init__(self, stage: str, config: Path, *args: str, env: dict[str, str] | None = None,
                 command: list[str] | None = None) -> None:
        command = command or [sys.executable, "-m", "trainer"]
        self.process = subprocess.Popen([*command, stage, "--config", str(config), *args], cwd=REPO_ROOT,
                                        env=trainer_env(**(env or {})), stdout=subprocess.DEVNULL,
                                        stderr=subprocess.PIPE, text=True, start_new_session=True)
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.process.stderr:
            with self._changed:
                self.lines.append(line.rstrip("\n"))
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    @property
    def stderr(self) -> str:
        return "\n".join(self.lines)

    def wait_for(self, pattern: str, timeout: float = 120) -> re.Match:
        """Block until a stderr line matches `pattern` (a regex); AssertionError if the process ends first."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        seen = 0
        with self._changed:
            while True:
                for line in self.lines[seen:]:
                    match = regex.search(line)
                    if match:
                        return match
                seen = len(self.lines)
                if self.process.poll() is not None and not self._reader.is_alive():
                    raise AssertionError(f"exited ({self.process.returncode}) before {pattern!r}:\n{self.stderr[-3000:]}")
                if time.monotonic() > deadline:
                    raise AssertionError(f"no {pattern!r} within {timeout} s:\n{self.stderr[-3000:]}")
                self._changed.wait(timeout=0.5)

    def send(self, number: int = signal.SIGTERM) -> None:
        self.process.send_signal(number)

    def wait(self, timeout: float = 300) -> int:
        code = self.process.wait(timeout=timeout)
        self._reader.join(timeout=10)
        return code

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.wait()


def run_trainer(stage: str, config: Path, *args: str, env: dict[str, str] | None = None,
                timeout: float = 300) -> tuple[int, str]:
    """Run to the end; (exit status, stderr)."""
    child = TrainerProcess(stage, config, *args, env=env)
    try:
        return child.wait(timeout), child.stderr
    finally:
        child.kill()


def error_lines(stderr: str) -> list[str]:
    """The lines `python -m trainer` ends with on a handled failure (`SomeError: ...`)."""
    return [line for line in stderr.splitlines() if re.match(r"^[A-Z][A-Za-z]+(Error|Finished): ", line)]


def exported_weights(output: Path, name: str = "model") -> dict[str, torch.Tensor]:
    return load_file(output / name / "model.safetensors")


def assert_identical(left: dict[str, torch.Tensor], right: dict[str, torch.Tensor]) -> None:
    assert left.keys() == right.keys()
    for key in left:
        assert torch.equal(left[key], right[key]), key


def latest_step(checkpoints: Path) -> int:
    return int((checkpoints / "latest").read_text().strip().removeprefix("step-"))
