"""Where metrics and params go. Training code only sees the `Tracker` interface.

Rank 0 gets a real tracker and other ranks a `NullTracker`, so the loop never asks its rank.
`JsonlTracker` writes the run's metrics file (one JSON object per logged step), which the KFP
component publishes; `trainer.tracking.mlflow_tracker.MlflowTracker` sends the same to MLflow.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Protocol

from trainer.config import TrackingConfig
from trainer.redact import redact_params, redact_text


class Tracker(Protocol):
    def log_params(self, params: dict[str, Any]) -> None: ...

    def log_metrics(self, metrics: dict[str, float], step: int) -> None: ...

    def log_model(self, directory: Path) -> None: ...

    def close(self) -> None: ...


class NullTracker:
    def log_params(self, params: dict[str, Any]) -> None:
        pass

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        pass

    def log_model(self, directory: Path) -> None:
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
        (self.directory / "params.json").write_text(json.dumps(redact_params(params), indent=2, default=str))

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        self._handle.write(json.dumps({"step": step, **metrics}) + "\n")
        self._handle.flush()

    def log_model(self, directory: Path) -> None:
        pass

    def close(self) -> None:
        self._handle.close()


class MultiTracker:
    """Sends every call to each of its trackers, in order."""

    def __init__(self, trackers: list[Tracker]) -> None:
        self.trackers = trackers

    def log_params(self, params: dict[str, Any]) -> None:
        for tracker in self.trackers:
            tracker.log_params(params)

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        for tracker in self.trackers:
            tracker.log_metrics(metrics, step)

    def log_model(self, directory: Path) -> None:
        for tracker in self.trackers:
            tracker.log_model(directory)

    def close(self) -> None:
        for tracker in self.trackers:
            tracker.close()


def build_tracker(directory: Path, is_main_process: bool, config: TrackingConfig | None = None,
                  run_name: str = "run") -> Tracker:
    """Rank 0: the metrics file, plus MLflow unless `tracking.backend` is none. Other ranks: no-op."""
    if not is_main_process:
        return NullTracker()
    trackers: list[Tracker] = [JsonlTracker(directory)]
    if config is not None and config.backend == "mlflow":
        from trainer.runtime import read_tracking_env
        from trainer.tracking.mlflow_tracker import MlflowTracker

        try:
            tracker = MlflowTracker(config, read_tracking_env(), run_name)
            trackers.append(tracker)
            # Where the run is, for reports that link to it (published with the run's outputs; no credentials).
            (directory / "mlflow_run.json").write_text(json.dumps(tracker.location()))
        except Exception as err:  # noqa: BLE001 - no tracking server must not stop training
            logging.getLogger(__name__).warning("MLflow tracking disabled for this run: %s", redact_text(str(err)))
    return MultiTracker(trackers)
