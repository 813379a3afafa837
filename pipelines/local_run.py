"""`alignflow run`: a whole pipeline on this machine with kfp.local and the local launcher.

Every stage's PyTorchJob runs as local processes, artifacts live under a local pipeline root, and
MLflow tracks to `<root>/mlflow.db` unless MLFLOW_TRACKING_URI says otherwise. The summary reads
each task's outputs back from the pipeline root.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from pathlib import Path
from typing import Any

from pipelines.catalog import get_pipeline

LOCAL_ARGUMENTS = {"launcher_mode": "local", "gpus_per_node": 0, "trainer_image": "alignflow-trainer:latest"}


class _TaskProgress(logging.Filter):
    """Turns kfp.local's log records into a one-line progress display (a rich status on a terminal).

    A filter on the root logger, not a handler: kfp.local replaces the root logger's handlers
    while it runs, but leaves its filters alone. It lets every record through.
    """

    COLOUR = re.compile(r"\x1b\[[0-9;]*m")
    STARTED = re.compile(r"Executing task '([\w-]+)'")
    FINISHED = re.compile(r"Task '([\w-]+)' finished with status")

    def __init__(self, status: Any) -> None:
        super().__init__()
        self.status = status
        self.started = time.monotonic()
        self.done: list[str] = []

    def filter(self, record: logging.LogRecord) -> bool:
        self._update(record.getMessage())
        return True

    def _update(self, message: str) -> None:
        message = self.COLOUR.sub("", message)
        if match := self.STARTED.search(message):
            finished = ", ".join(self.done) or "-"
            self.status.update(f"[bold]{match.group(1)}[/] running ({time.monotonic() - self.started:.0f} s; "
                               f"done: {finished})")
        elif match := self.FINISHED.search(message):
            self.done.append(match.group(1))


def local_arguments(name: str, root: Path, arguments: dict[str, Any], preset: str | None) -> dict[str, Any]:
    """The parameters of a local run: local launcher on CPU, then the preset's, then the caller's."""
    from pipelines.presets import preset_arguments

    accepted = set(get_pipeline(name).component_spec.inputs or {})
    chosen = preset_arguments(preset, name, root, accepted) if preset else {}
    return {**LOCAL_ARGUMENTS, **chosen, **arguments}


def run_locally(name: str, root: Path, arguments: dict[str, Any], preset: str | None = None) -> Path:
    """Run pipeline `name` under `root` (with a preset's parameters, e.g. `tiny`); return the run's folder."""
    from rich.console import Console

    console = Console(stderr=True)
    with console.status(f"starting {name}") as status:
        progress = _TaskProgress(status)
        logging.getLogger().addFilter(progress)
        try:
            return _run(name, root, local_arguments(name, root.resolve(), arguments, preset))
        finally:
            logging.getLogger().removeFilter(progress)


def _run(name: str, root: Path, arguments: dict[str, Any]) -> Path:
    from kfp import local

    root = root.resolve()
    root.mkdir(parents=True, exist_ok=True)
    before = set(root.iterdir())
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(root))
    # Task processes inherit this environment: point MLflow at the root for the run only.
    saved = os.environ.get("MLFLOW_TRACKING_URI")
    os.environ["MLFLOW_TRACKING_URI"] = saved or f"sqlite:///{root / 'mlflow.db'}"
    try:
        get_pipeline(name)(**{**LOCAL_ARGUMENTS, **arguments})
    finally:
        if saved is None:
            os.environ.pop("MLFLOW_TRACKING_URI")
    created = [p for p in root.iterdir() if p not in before and p.is_dir()]
    return max(created, key=lambda p: p.stat().st_mtime)


def task_outputs(run_dir: Path, started: float) -> dict[str, dict]:
    """Per task, in the order they finished: wall time, metrics and returned values, model folder.

    The local runner runs one task at a time, so a task's time is the gap since the previous
    task (or the run's start, `started`, a `time.time()`) finished.
    """
    summary = {}
    finished = sorted(((p / "executor_output.json").stat().st_mtime, p) for p in run_dir.iterdir()
                      if (p / "executor_output.json").is_file())
    previous = started
    for finish, task_dir in finished:
        output = json.loads((task_dir / "executor_output.json").read_text())
        metrics: dict[str, float] = {}
        for artifact in output.get("artifacts", {}).get("metrics", {}).get("artifacts", []):
            metrics.update({k: v for k, v in artifact.get("metadata", {}).items() if isinstance(v, (int, float))})
        metrics.update({k: v for k, v in output.get("parameterValues", {}).items() if isinstance(v, (int, float))})
        model = task_dir / "model"
        summary[task_dir.name] = {"seconds": finish - previous, "metrics": metrics,
                                  "model": str(model) if (model / "config.json").is_file() else ""}
        previous = finish
    return summary


KEY_METRICS = ("eval_loss", "eval_accuracy", "eval_rewards_accuracies", "eval_reward_before", "eval_reward",
               "reward", "baseline_reward", "rm_score", "baseline_rm_score", "improvement")


def format_summary(summary: dict[str, dict], elapsed: float) -> str:
    """One line per task under a header; each column as wide as its widest cell, so long task names
    (`train-reward-model`, `fingerprint-inputs`) and many metrics keep the columns aligned."""
    rows = [(task, f"{info['seconds']:.1f}s",
             ", ".join(f"{k}={info['metrics'][k]:.3g}" for k in KEY_METRICS if k in info["metrics"]), info["model"])
            for task, info in summary.items()]
    header = ("task", "time", "key metrics", "model")
    widths = [max(len(row[column]) for row in [header, *rows]) for column in range(3)]
    lines = [f"{task:<{widths[0]}}  {time:>{widths[1]}}  {shown:<{widths[2]}}  {model}".rstrip()
             for task, time, shown, model in [header, *rows]]
    lines.append(f"total {elapsed:.0f} s")
    return "\n".join(lines)


def run_and_summarise(name: str, root: Path, arguments: dict[str, Any], preset: str | None = None) -> str:
    started = time.time()
    run_dir = run_locally(name, root, arguments, preset)
    return format_summary(task_outputs(run_dir, started), time.time() - started)
