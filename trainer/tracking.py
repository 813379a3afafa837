"""Where metrics and params go. Training code only sees the `Tracker` interface.

Rank 0 gets a real tracker and other ranks a `NullTracker`, so the loop never asks its rank.
`JsonlTracker` writes the run's metrics file (one JSON object per logged step), which the KFP
component later publishes; MLflow joins as another implementation with the tracking issue.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Protocol


class Tracker(Protocol):
    def log_params(self, params: dict[str, Any]) -> None: ...

    def log_metrics(self, metrics: dict[str, float], step: int) -> None: ...

    def close(self) -> None: ...


class NullTracker:
    def log_params(self, params: dict[str, Any]) -> None:
        pass

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        pass

    def close(self) -> None:
        pass


class JsonlTracker:
    """Appends `{"step": N, ...metrics}` lines to `<output_dir>/metrics.jsonl`; params to `params.json`."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self._handle = (directory / "metrics.jsonl").open("a")

    def log_params(self, params: dict[str, Any]) -> None:
        (self.directory / "params.json").write_text(json.dumps(params, indent=2, default=str))

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        self._handle.write(json.dumps({"step": step, **metrics}) + "\n")
        self._handle.flush()

    def close(self) -> None:
        self._handle.close()


def build_tracker(directory: Path, is_main_process: bool) -> Tracker:
    return JsonlTracker(directory) if is_main_process else NullTracker()
