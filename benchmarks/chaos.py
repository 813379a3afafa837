"""`make chaos`: kill training stages at random points, resume them, and check nothing was lost.

For each stage, one uninterrupted run gives the reference weights. Then each trial starts the same
run, waits for a random step (episode for grpo) plus a random fraction of a second, and kills it
with SIGKILL (a crash, an OOM kill) or SIGTERM (a preemption), alternating; the rerun resumes from
the newest complete checkpoint and finishes. A trial counts as resumed bit-exact when the final
exported weights equal the reference bit for bit. Steps lost is how far the killed run had got past
the checkpoint the rerun resumed from (work done twice); SIGTERM should lose none.

Usage: python benchmarks/chaos.py [--stages sft,dpo,rm,grpo] [--kills 4] [--seed 0] [--workdir DIR]
Exits 1 if any trial did not resume bit-exact.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import yaml
from safetensors.torch import load_file

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from trainer.tiny.model import write_tiny_model  # noqa: E402
from trainer.tiny.task import write_task  # noqa: E402

# -- the stages and how far they run ---------------------------------------------------------------


def stage_config(stage: str, output: Path, model: Path, task: dict[str, Path]) -> dict:
    base = {"output_dir": str(output), "model": {"path": str(model)}, "optimizer": {"lr": 2e-3, "warmup_steps": 2},
            "tracking": {"backend": "none"}}
    if stage in ("sft", "rm", "dpo"):
        data = task["sft_train"] if stage == "sft" else task["pref_eval"]
        return {**base, "data": {"train_path": str(data), "max_length": 32},
                "train": {"max_epochs": 3, "micro_batch_size": 8, "log_interval": 1},
                "checkpoint": {"save_interval": 4, "keep_last": 2}}
    options = {"num_episodes": 12, "rollout_batch_size": 4, "mini_batch_size": 4}
    if stage == "grpo":
        options["num_generations"] = 2
    return {**base, "data": {"train_path": str(task["prompts"]), "max_length": 32}, "train": {"micro_batch_size": 4},
            "generation": {"max_new_tokens": 3}, "reward": {"function": "trainer.tiny.task:reward"},
            "checkpoint": {"save_interval": 2, "keep_last": 2}, stage: options}


PROGRESS = {"online": re.compile(r"episode (\d+): reward"), "supervised": re.compile(r" step (\d+)/(\d+) ")}
RESUMED = re.compile(r"resumed from .*step-(\d+)")
# A signal that lands after the last step (during the export) leaves a finished run: the rerun says so
# and trains nothing, so no work is done twice.
FINISHED = re.compile(r"already holds a finished \w+ run")


# -- one process ----------------------------------------------------------------------------------


class Run:
    """`python -m trainer <stage>` with its stderr followed, so it can be killed at a given step."""

    def __init__(self, stage: str, config: Path) -> None:
        env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
        self.process = subprocess.Popen([sys.executable, "-m", "trainer", stage, "--config", str(config)],
                                        cwd=REPO_ROOT, env={**env, "OMP_NUM_THREADS": "1"}, text=True,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
        self.pattern = PROGRESS["online" if stage in ("ppo", "grpo") else "supervised"]
        self.step = 0
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.process.stderr:
            self.lines.append(line)
            match = self.pattern.search(line)
            if match:
                self.step = int(match.group(1))  # steps done; online: episodes done before the one logged

    def kill_at(self, step: int, extra_seconds: float, number: int) -> int:
        """Signal the process once it has logged `step`, after `extra_seconds`; the step it had reached."""
        while self.step < step and self.process.poll() is None:
            time.sleep(0.005)
        time.sleep(extra_seconds)
        reached = self.step
        if self.process.poll() is None:
            self.process.send_signal(number)
        self.wait()
        return reached

    def wait(self) -> int:
        code = self.process.wait()
        self._reader.join(timeout=10)
        return code

    @property
    def stderr(self) -> str:
        return "".join(self.lines)


# -- trials -----------------------------------------------------------------------------------------


@dataclass
class Tally:
    kills: int = 0
    bit_exact: int = 0
    steps_lost: list[int] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)


def final_weights(output: Path) -> dict[str, torch.Tensor]:
    return load_file(output / "model" / "model.safetensors")


def run_to_end(stage: str, config: Path) -> str:
    run = Run(stage, config)
    code = run.wait()
    if code != 0:
        raise RuntimeError(f"{stage} exited {code}:\n{run.stderr[-3000:]}")
    return run.stderr


def trial(stage: str, directory: Path, model: Path, task: dict, reference: dict, total: int, rng: random.Random,
          number: int, tally: Tally) -> None:
    output = directory / "out"
    config = directory / "config.yaml"
    config.write_text(yaml.safe_dump(stage_config(stage, output, model, task)))
    target = rng.randint(1, total - 1)
    reached = Run(stage, config).kill_at(target, rng.uniform(0, 0.3), number)
    tally.kills += 1
    stderr = run_to_end(stage, config)
    match = RESUMED.search(stderr)
    resumed_from = reached if FINISHED.search(stderr) else int(match.group(1)) if match else 0
    tally.steps_lost.append(max(0, reached - resumed_from))
    weights = final_weights(output)
    if weights.keys() == reference.keys() and all(torch.equal(weights[k], reference[k]) for k in reference):
        tally.bit_exact += 1
    else:
        tally.failures.append(f"{stage} {signal.Signals(number).name} at step {reached}: weights differ")


def total_steps(stage: str, stderr: str) -> int:
    if stage in ("ppo", "grpo"):
        return 12
    return int(re.findall(r" step \d+/(\d+) ", stderr)[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stages", default="sft,dpo,rm,grpo")
    parser.add_argument("--kills", type=int, default=4, help="Kills per stage (alternating SIGKILL, SIGTERM).")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    root = args.workdir or Path(tempfile.mkdtemp(prefix="alignflow-chaos-"))
    model, task = write_tiny_model(root / "model"), write_task(root / "task")
    rows = []
    failures: list[str] = []
    for stage in args.stages.split(","):
        reference_dir = root / stage / "reference"
        config = reference_dir / "config.yaml"
        reference_dir.mkdir(parents=True)
        config.write_text(yaml.safe_dump(stage_config(stage, reference_dir / "out", model, task)))
        total = total_steps(stage, run_to_end(stage, config))
        reference = final_weights(reference_dir / "out")
        for number in (signal.SIGKILL, signal.SIGTERM):
            tally = Tally()
            for index in range(args.kills // 2 + (args.kills % 2 if number == signal.SIGKILL else 0)):
                directory = root / stage / f"{signal.Signals(number).name}-{index}"
                directory.mkdir(parents=True)
                trial(stage, directory, model, task, reference, total, rng, number, tally)
                shutil.rmtree(directory / "out", ignore_errors=True)
            failures += tally.failures
            lost = tally.steps_lost
            rows.append((stage, signal.Signals(number).name, tally.kills, tally.bit_exact,
                         f"{sum(lost)} (max {max(lost, default=0)})"))
            print(f"{stage:5} {signal.Signals(number).name:8} done", file=sys.stderr)
    header = ("stage", "signal", "kills tried", "resumed bit-exact", "steps lost (total, max per kill)")
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
    print("| " + " | ".join(h.ljust(w) for h, w in zip(header, widths)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in rows:
        print("| " + " | ".join(str(c).ljust(w) for c, w in zip(row, widths)) + " |")
    for failure in failures:
        print(f"FAILED: {failure}")
    if args.workdir is None:
        shutil.rmtree(root, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
