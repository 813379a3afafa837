"""Where metrics and params go. Training code only sees the `Tracker` interface.

Rank 0 gets a real tracker and other ranks a `NullTracker`, so the loop never asks its rank.
`JsonlTracker` writes the run's metrics file (one JSON object per logged step, valid JSON: a
non-finite value is written as null), which the KFP component publishes;
`trainer.tracking.mlflow_tracker.MlflowTracker` sends the same to MLflow.

A resumed run continues its MLflow run (`resume_run_id`, kept in every checkpoint's manifest) rather
than opening a new one; the run is marked running again and its params, already logged by the
first attempt, are not logged again (MLflow params cannot change).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from pathlib import Path
from typing import Any, Protocol

from trainer.config import TrackingConfig
from trainer.jsonio import dumps
from trainer.redact import redact_params, redact_text

logger = logging.getLogger(__name__)


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
    """Writes `{"step": N, ...metrics}` lines to `<output_dir>/metrics.jsonl`; params to `params.json`.

    One line per step: metrics logged again for the step of the last line (an epoch's eval after its
    last step, a checkpoint's save time) are merged into that line, which is rewritten, so anything
    keyed by step reads each step once. The metrics file is opened at the first `log_metrics`, so a
    resume can first set the history it continues (`trainer.lifecycle.resume.restore_history`).
    """

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self._handle = None
        self._last_offset = 0
        self._last: dict[str, Any] | None = None

    def log_params(self, params: dict[str, Any]) -> None:
        """Adds to the params logged so far, as MLflow does (the config, then e.g. `rollout.chosen_engine`)."""
        path = self.directory / "params.json"
        logged = json.loads(path.read_text()) if path.exists() else {}
        path.write_text(dumps(logged | redact_params(params), indent=2, default=str))

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        if self._handle is None:
            self._open()
        if self._last is not None and self._last.get("step") == step:
            record = {**self._last, **metrics}
            self._handle.truncate(self._last_offset)  # the append below rewrites the step's line
        else:
            record = {"step": step, **metrics}
            self._last_offset = self._handle.seek(0, os.SEEK_END)
        self._handle.write((dumps(record) + "\n").encode())
        self._handle.flush()
        self._last = record

    def _open(self) -> None:
        path = self.directory / "metrics.jsonl"
        path.touch()
        self._last_offset, self._last, is_cut = last_record(path)
        self._handle = path.open("ab")
        if is_cut:
            self._handle.write(b"\n")  # after a line cut by a kill (kept, unparsable), not onto it

    def log_model(self, directory: Path) -> None:
        pass

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None


def last_record(path: Path, tail_bytes: int = 1 << 16) -> tuple[int, dict[str, Any] | None, bool]:
    """(offset of the last line, its record, whether the file ends inside a line) of a metrics file. The record
    is None when the file is empty or its last line is not a complete JSON object: nothing is merged into it."""
    with path.open("rb") as handle:
        size = handle.seek(0, os.SEEK_END)
        start = handle.seek(max(0, size - tail_bytes))
        tail = handle.read()
    if not tail.endswith(b"\n"):
        return size, None, bool(tail)
    cut = tail.rfind(b"\n", 0, len(tail) - 1)
    if cut < 0 and start > 0:
        return size, None, False  # a last line longer than the tail read
    try:
        record = json.loads(tail[cut + 1:])
    except ValueError:
        return size, None, False
    return start + cut + 1, record if isinstance(record, dict) else None, False


class ContinuedRun:
    """An MLflow tracker continuing a run of an earlier attempt: everything but params goes through."""

    def __init__(self, tracker: Any) -> None:
        self.tracker = tracker
        self.run_id = tracker.run_id

    def log_params(self, params: dict[str, Any]) -> None:
        pass  # logged by the first attempt; MLflow refuses a param whose value changed

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        self.tracker.log_metrics(metrics, step)

    def log_model(self, directory: Path) -> None:
        self.tracker.log_model(directory)

    def close(self) -> None:
        self.tracker.close()


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


def mlflow_run_id(tracker: Tracker) -> str | None:
    """The MLflow run a tracker logs to, or None."""
    for member in getattr(tracker, "trackers", [tracker]):
        if getattr(member, "run_id", None):
            return member.run_id
    return None


def _continue_mlflow_run(config: TrackingConfig, run_name: str, run_id: str) -> ContinuedRun | None:
    """An MLflow tracker on the earlier attempt's run, marked running again; None if that run is gone."""
    from trainer.runtime import read_tracking_env
    from trainer.tracking.mlflow_tracker import MlflowTracker

    env = read_tracking_env()
    if env.run_id is not None:
        return None  # MLFLOW_RUN_ID names the run explicitly
    try:
        tracker = MlflowTracker(config, dataclasses.replace(env, run_id=run_id), run_name)
        tracker.client.update_run(run_id, status="RUNNING")
    except Exception as err:  # noqa: BLE001 - a new run is better than no tracking
        logger.warning("cannot continue MLflow run %s (%s); starting a new run", run_id, redact_text(str(err)))
        return None
    logger.info("continuing MLflow run %s of the interrupted attempt", run_id)
    return ContinuedRun(tracker)


def build_tracker(directory: Path, is_main_process: bool, config: TrackingConfig | None = None,
                  run_name: str = "run", resume_run_id: str | None = None) -> Tracker:
    """Rank 0: the metrics file, plus MLflow unless `tracking.backend` is none. Other ranks: no-op.

    Args:
        directory: Where `metrics.jsonl`, `params.json` and `mlflow_run.json` go.
        is_main_process: Only rank 0 tracks.
        config: The stage's tracking section (None: the metrics file only).
        run_name: Default MLflow run name (the stage).
        resume_run_id: The MLflow run of the attempt being resumed, continued instead of a new run.

    Returns:
        The tracker (a `MultiTracker` on rank 0; it reports progress to the TrainJob too where Kubeflow Trainer
        injected its status endpoint: `trainer.tracking.trainjob_status`).
    """
    if not is_main_process:
        return NullTracker()
    trackers: list[Tracker] = [JsonlTracker(directory)]
    if config is not None and config.backend == "mlflow":
        from trainer.runtime import read_tracking_env
        from trainer.tracking.mlflow_tracker import MlflowTracker

        try:
            tracker = _continue_mlflow_run(config, run_name, resume_run_id) if resume_run_id else None
            tracker = tracker or MlflowTracker(config, read_tracking_env(), run_name)
            trackers.append(tracker)
            # Where the run is, for reports that link to it (published with the run's outputs; no credentials).
            location = (tracker.tracker if isinstance(tracker, ContinuedRun) else tracker).location()
            (directory / "mlflow_run.json").write_text(json.dumps(location))
        except Exception as err:  # noqa: BLE001 - no tracking server must not stop training
            logging.getLogger(__name__).warning("MLflow tracking disabled for this run: %s", redact_text(str(err)))
    from trainer.runtime import read_trainjob_status_env
    from trainer.tracking.trainjob_status import build_status_reporter

    reporter = build_status_reporter(read_trainjob_status_env())  # the TrainJob's progress, where Trainer takes it
    return MultiTracker(trackers + ([reporter] if reporter is not None else []))
