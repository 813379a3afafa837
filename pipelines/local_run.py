"""`alignflow run`: a whole pipeline on this machine with kfp.local and the local launcher.

Every stage's PyTorchJob runs as local processes, artifacts live under a local pipeline root, and
MLflow tracks to `<root>/mlflow.db` unless MLFLOW_TRACKING_URI says otherwise. Each task's executor
output goes to its own log file (pipelines/task_logs.py) while the terminal shows a line per task
(pipelines/run_display.py). The summary reads each task's outputs back from the pipeline root.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from pipelines.catalog import get_pipeline
from pipelines.run_display import RunDisplay
from pipelines.task_logs import capture_task_logs
from trainer.errors import PipelineError

LOCAL_ARGUMENTS = {"launcher_mode": "local", "gpus_per_node": 0, "trainer_image": "alignflow-trainer:latest"}


def local_arguments(name: str, root: Path, arguments: dict[str, Any], preset: str | None) -> dict[str, Any]:
    """The parameters of a local run: local launcher on CPU, then the preset's, then the caller's."""
    from pipelines.presets import preset_arguments

    accepted = set(get_pipeline(name).component_spec.inputs or {})
    chosen = preset_arguments(preset, name, root, accepted) if preset else {}
    return {**LOCAL_ARGUMENTS, **chosen, **arguments}


class LocalRunFailed(PipelineError):
    """A task of a local run failed (the run's exit handler has still run); names the tasks' log files."""


def default_log_dir(root: Path, name: str) -> Path:
    """Where a run's executor logs go by default: `<root>/logs/<pipeline>-<UTC time>/<task>.log`."""
    return root.resolve() / "logs" / f"{name}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}"


def run_locally(name: str, root: Path, arguments: dict[str, Any], preset: str | None = None,
                log_dir: Path | None = None, verbose: bool = False) -> Path:
    """Run pipeline `name` under `root` (with a preset's parameters, e.g. `tiny`); return the run's folder.

    Each task's executor output goes to `log_dir/<task>.log` (default: `default_log_dir`); stderr shows a
    line per task as it starts and ends, or, with `verbose`, the executor output itself as well.

    Raises:
        LocalRunFailed: A task failed; the message names its log file.
    """
    from rich.console import Console

    log_dir = log_dir or default_log_dir(root, name)
    # Bound to the terminal's stderr now: a Console left to find sys.stderr later would find the capture.
    with RunDisplay(Console(file=sys.stderr), quiet=verbose) as display:
        with capture_task_logs(log_dir, display, verbose) as router:
            try:
                return _run(name, root, local_arguments(name, root.resolve(), arguments, preset))
            except RuntimeError as err:  # kfp.local's "Pipeline ... finished with status FAILURE"
                if not router.failed:
                    raise
                error = err
        logs = ", ".join(f"{task} ({router.log_path(task)})" for task in router.failed)
    raise LocalRunFailed(f"{name}: task(s) failed: {logs}; all executor logs: {log_dir}") from error


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
    # kfp.local names the run's folder `<pipeline>-<time>`.
    created = [p for p in root.iterdir() if p not in before and p.is_dir() and p.name.startswith(f"{name}-")]
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


def gate_cells(metrics: dict[str, float]) -> list[str]:
    """The evaluation's gate decisions, e.g. `gate: +0.500 >= +0.312 at 95%: opens` (the paired gain over the
    baseline, its lower confidence bound, the decision; then the same against the champion)."""
    cells = []
    for prefix, against in (("gate", ""), ("champion_gate", " vs champion")):
        if f"{prefix}/lower_bound" in metrics:
            verdict = "opens" if metrics[f"{prefix}/opens"] else "refused"
            guards = [key.split("/")[2] for key, holds in metrics.items()
                      if key.startswith(f"{prefix}/guard/") and key.endswith("/holds") and not holds]
            cells.append(f"gate{against}: {metrics[f'{prefix}/difference']:+.3f} >= "
                         f"{metrics[f'{prefix}/lower_bound']:+.3f} at {metrics[f'{prefix}/confidence']:.0%}: {verdict}"
                         + (f" (guard {', '.join(guards)} fell)" if guards else ""))
    return cells


def format_summary(summary: dict[str, dict], elapsed: float) -> str:
    """One line per task under a header; each column as wide as its widest cell, so long task names
    (`train-reward-model`, `fingerprint-inputs`) and many metrics keep the columns aligned."""
    rows = [(task, f"{info['seconds']:.1f}s",
             ", ".join([f"{k}={info['metrics'][k]:.3g}" for k in KEY_METRICS if k in info["metrics"]]
                       + gate_cells(info["metrics"])), info["model"])
            for task, info in summary.items()]
    header = ("task", "time", "key metrics", "model")
    widths = [max(len(row[column]) for row in [header, *rows]) for column in range(3)]
    lines = [f"{task:<{widths[0]}}  {time:>{widths[1]}}  {shown:<{widths[2]}}  {model}".rstrip()
             for task, time, shown, model in [header, *rows]]
    lines.append(f"total {elapsed:.0f} s")
    return "\n".join(lines)


def run_and_summarise(name: str, root: Path, arguments: dict[str, Any], preset: str | None = None,
                      verbose: bool = False) -> str:
    """Run pipeline `name` locally and return the summary table, with where the executor logs are."""
    started = time.time()
    log_dir = default_log_dir(root, name)
    run_dir = run_locally(name, root, arguments, preset, log_dir, verbose)
    summary = format_summary(task_outputs(run_dir, started), time.time() - started)
    return f"{summary}\nexecutor logs: {log_dir}/<task>.log"
