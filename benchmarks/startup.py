"""How long `python -m trainer` takes to start: its answers that need no stage, and an SFT stage's first step.

Each figure is one fresh process, as a pod or a test starts one:

- `import`: `import trainer.__main__` (what every run pays before reading its flags);
- `--help`, `--help-config`: the entry point's answers about itself;
- `bad config`: a config with an unknown key, which ends with one message and exit code 2;
- `first step`: `python -m trainer sft` on the tiny model and task (`trainer.tiny`, tracking off)
  until the log line of optimizer step 1, the time the suite's stages spend before they train.

Wall seconds are the median of `--repeats` runs; CPU seconds (user + system of the process and its
children, for `first step` the whole run of one step and its export) vary less on a busy machine.
`--tree` names checkouts to compare side by side (each run puts one on PYTHONPATH, and the runs of
the trees alternate), e.g. the tree of an older commit from `git archive`:

    git archive 4d316cf trainer | tar -x -C /tmp/before
    python benchmarks/startup.py --tree /tmp/before --tree .

What it leaves out: MLflow (`tracking.backend: mlflow` adds the import of mlflow, about 3 s) and torchrun's
agent (`python -m trainer.launch`), which a PyTorchJob adds in front of the trainer.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIRST_STEP_LINE = "step 1/"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", action="append", type=Path, help="A checkout to measure (repeatable; default this one).")
    parser.add_argument("--repeats", type=int, default=3, help="Runs of each measurement per tree (default 3).")
    return parser.parse_args(argv)


def write_inputs(directory: Path) -> dict[str, Path]:
    """The tiny model and task, an SFT config of one optimizer step, and a config with an unknown key."""
    import yaml

    from trainer.tiny.model import write_tiny_model
    from trainer.tiny.task import write_task

    model = write_tiny_model(directory / "model")
    files = write_task(directory / "task")
    config = {"output_dir": str(directory / "out"), "model": {"path": str(model)},
              "data": {"train_path": str(files["sft_train"]), "max_length": 32},
              "train": {"micro_batch_size": 8, "log_interval": 1, "max_epochs": 1, "max_steps": 1},
              "checkpoint": {"keep_last": 0}, "tracking": {"backend": "none"}}
    good, bad = directory / "sft.yaml", directory / "bad.yaml"
    good.write_text(yaml.safe_dump(config))
    bad.write_text(yaml.safe_dump({**config, "no_such_key": 1}))
    return {"good": good, "bad": bad, "out": directory / "out"}


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(command: list[str], tree: Path, until: str | None = None) -> tuple[float, float]:
    """(wall seconds until the process ends, or until a stderr line contains `until`; CPU seconds of the run)."""
    env = {**os.environ, "PYTHONPATH": str(tree.resolve()), "OMP_NUM_THREADS": "1"}
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        env.pop(name, None)
    cpu, started = children_cpu(), time.monotonic()
    process = subprocess.Popen(command, env=env, cwd=tempfile.gettempdir(), stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
    wall = None
    for line in process.stderr:
        if until is not None and wall is None and until in line:
            wall = time.monotonic() - started
    process.wait()
    if wall is None:
        wall = time.monotonic() - started
        if until is not None:
            raise RuntimeError(f"{' '.join(command)} (PYTHONPATH={tree}) never logged {until!r}")
    return wall, children_cpu() - cpu


def measurements(inputs: dict[str, Path]) -> dict[str, tuple[list[str], str | None]]:
    python = [sys.executable]
    return {
        "import": (python + ["-c", "import trainer.__main__"], None),
        "--help": (python + ["-m", "trainer", "--help"], None),
        "--help-config": (python + ["-m", "trainer", "sft", "--help-config"], None),
        "bad config": (python + ["-m", "trainer", "sft", "--config", str(inputs["bad"])], None),
        "first step": (python + ["-m", "trainer", "sft", "--config", str(inputs["good"])], FIRST_STEP_LINE),
    }


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    trees = args.tree or [ROOT]
    with tempfile.TemporaryDirectory() as directory:
        inputs = write_inputs(Path(directory))
        runs = measurements(inputs)
        results: dict[tuple[str, Path], list[tuple[float, float]]] = {}
        for _ in range(args.repeats):
            for name, (command, until) in runs.items():
                for tree in trees:  # alternate the trees so that a change of load hits both alike
                    if name == "first step":
                        subprocess.run(["rm", "-rf", str(inputs["out"])], check=True)
                    results.setdefault((name, tree), []).append(timed(command, tree, until))
    print(f"median of {args.repeats} runs; wall s / CPU s")
    print(f"{'':16s}" + "".join(f"{str(tree):>28s}" for tree in trees))
    for name in runs:
        cells = []
        for tree in trees:
            walls, cpus = zip(*results[(name, tree)])
            cells.append(f"{statistics.median(walls):8.2f} / {statistics.median(cpus):6.2f}")
        print(f"{name:16s}" + "".join(f"{cell:>28s}" for cell in cells))


if __name__ == "__main__":
    main()
