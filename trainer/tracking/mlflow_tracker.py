"""MLflow tracking from rank 0, built so that a tracking outage never stops training.

Metrics are queued and sent in batches by a background thread, at most one call every
`SEND_INTERVAL_SECONDS` (a flush or `close` sends at once): a call per optimizer step made a GRPO run
of short steps 18-33% slower, the sender's work taking CPU from the training threads
(benchmarks/README.md). When the server is down the thread warns once, keeps the values, and retries
with backoff; `close` waits a bounded time for the queue to drain and reports what could not be sent
(those values are still in `metrics.jsonl`).
`mlflow` is imported here only, and only when a tracker is built (it costs seconds to import).

Embedded default: with no `MLFLOW_TRACKING_URI`, runs go to `sqlite:///mlflow.db` in the working
directory (MLflow 3's own default) when it is writable; a non-root pod whose working directory is
not (the image's WORKDIR, a read-only root filesystem) tracks to `mlflow.db` in the temporary
directory (`$TMPDIR`, else /tmp) with one warning that it is lost with the pod, and where neither is
writable tracking is off for the run (one warning; `metrics.jsonl` still has every value). Run linkage: `MLFLOW_RUN_ID` continues that run; otherwise a
run is created in `MLFLOW_EXPERIMENT_ID`, `MLFLOW_EXPERIMENT_NAME` or `tracking.experiment_name`,
nested under `tracking.parent_run_id` (or `ALIGNFLOW_PARENT_RUN_ID`) and tagged with the pipeline
run id.

Credentials (user info in `MLFLOW_TRACKING_URI`, `MLFLOW_TRACKING_PASSWORD`/`_TOKEN`) are MLflow's to
send; every URI or error this module prints or writes goes through `trainer.redact` first, and
params lose secret-looking keys and URI user info before they are logged.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

from trainer.config import TrackingConfig
from trainer.redact import SECRET_KEY, redact_params, redact_text, redact_uri
from trainer.runtime import TrackingEnv
from trainer.tracking.experiment import get_or_create_experiment

logger = logging.getLogger(__name__)

DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"
MAX_QUEUED = 100_000
CLOSE_TIMEOUT_SECONDS = 30.0
SEND_BATCH = 1000  # values per call
SEND_INTERVAL_SECONDS = 5.0  # how long values wait to be sent together; metrics.jsonl has each at once


class TrackingUnavailable(RuntimeError):
    """No tracking URI was given, and no embedded sqlite store can be kept (no folder to write it, or no local
    store in a client-only install)."""


def embedded_tracking_uri(working_dir: Path | None = None) -> str:
    """Where runs go without `MLFLOW_TRACKING_URI`; raises TrackingUnavailable when nowhere is writable, or when
    MLflow is installed without its local store (mlflow-skinny).

    The writability check comes first because MLflow would otherwise retry the sqlite file for minutes
    before the tracker gives up, and then say nothing about why.
    """
    try:
        import sqlalchemy  # noqa: F401 - MLflow's local store; the client-only mlflow-skinny has none
    except ImportError:
        raise TrackingUnavailable("no MLFLOW_TRACKING_URI, and this install has MLflow's client only (mlflow-skinny, "
                                  "as in the trainer image), which keeps no local store; set MLFLOW_TRACKING_URI (the "
                                  "chart's mlflow.trackingUri or mlflow.enabled)") from None
    working_dir = working_dir or Path.cwd()
    if os.access(working_dir, os.W_OK):
        return DEFAULT_TRACKING_URI
    # $TMPDIR as the pod sets it (an emptyDir), else /tmp; not tempfile's search, which would end in odd places.
    temporary = Path(os.environ.get("TMPDIR") or "/tmp")
    if not os.access(temporary, os.W_OK):
        raise TrackingUnavailable(f"no MLFLOW_TRACKING_URI, and neither the working directory {working_dir} nor "
                                  f"the temporary directory {temporary} is writable for the sqlite store; set "
                                  "MLFLOW_TRACKING_URI (the chart's mlflow.trackingUri or mlflow.enabled)")
    uri = f"sqlite:///{temporary / 'mlflow.db'}"
    logger.warning("no MLFLOW_TRACKING_URI and the working directory %s is not writable: tracking to %s, which is "
                   "lost with the pod; set MLFLOW_TRACKING_URI (the chart's mlflow.trackingUri or mlflow.enabled)",
                   working_dir, uri)
    return uri


def flatten(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """`{"a": {"b": 1}}` -> `{"a.b": 1}`, dropping keys that look secret."""
    flat = {}
    for key, value in values.items():
        if SECRET_KEY.search(key):
            continue
        if isinstance(value, dict):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


class MlflowTracker:
    """Logs to one MLflow run. Every call returns at once; sending happens on a background thread.

    Args:
        config: The stage's tracking section.
        env: Tracking settings from the environment.
        run_name: Default run name (the stage).
    """

    def __init__(self, config: TrackingConfig, env: TrackingEnv, run_name: str) -> None:
        # Fail fast per request so the sender can retry on its own schedule (users may override).
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
        tracking_uri = env.tracking_uri or embedded_tracking_uri()
        # MLflow prints "View run ... at <tracking URI>" to stdout, user info included; the INFO line
        # below says where the run is without it.
        os.environ["MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"] = "true"
        from mlflow import MlflowClient

        self.config = config
        self.task = run_name  # the stage: tagged `alignflow.task`, how the registration gate finds this run
        self.parent_run_id = config.parent_run_id or env.parent_run_id
        self.client = MlflowClient(tracking_uri=tracking_uri)
        self.run_id = env.run_id or self._create_run(env, config.run_name or run_name)
        self._queue: list[Any] = []
        self._lock = threading.Condition()
        self._closing = False
        self._failures = 0
        self._dropped = 0
        self._is_unreachable = False  # set by the sender during an outage
        self._flushing = 0  # callers waiting in `flush`: the sender does not wait for the interval then
        self._next_send = 0.0  # monotonic time of the sender's next call (the first values go at once)
        self._sender = threading.Thread(target=self._send_loop, name="mlflow-sender", daemon=True)
        self._sender.start()
        self._system_monitor = self._start_system_metrics() if config.system_metrics else None
        logger.info("tracking to MLflow run %s at %s", self.run_id, redact_uri(self.client.tracking_uri))

    def _create_run(self, env: TrackingEnv, run_name: str) -> str:
        from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID, MLFLOW_RUN_NAME

        experiment_id = env.experiment_id
        if experiment_id is None:
            experiment_id = get_or_create_experiment(self.client, env.experiment_name or self.config.experiment_name)
        tags = {MLFLOW_RUN_NAME: run_name, "alignflow.task": self.task, "alignflow.kind": "stage"}
        parent = self.parent_run_id
        if parent:
            tags[MLFLOW_PARENT_RUN_ID] = parent
        pipeline_run = self.config.pipeline_run_id or env.pipeline_run_id
        if pipeline_run:
            tags["alignflow.pipeline_run_id"] = pipeline_run
        return self.client.create_run(experiment_id, tags=tags, run_name=run_name).info.run_id

    def _start_system_metrics(self) -> Any:
        from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

        monitor = SystemMetricsMonitor(self.run_id)
        monitor.start()
        return monitor

    def location(self) -> dict[str, str]:
        """Tracking URI (without credentials), experiment and run ids, and a browser link when the server has a UI."""
        experiment_id = self.client.get_run(self.run_id).info.experiment_id
        uri = redact_uri(self.client.tracking_uri)
        link = f"{uri.rstrip('/')}/#/experiments/{experiment_id}/runs/{self.run_id}" if uri.startswith("http") else ""
        return {"tracking_uri": uri, "experiment_id": experiment_id, "run_id": self.run_id, "link": link}

    # -- the Tracker interface ----------------------------------------------------------------------

    def log_params(self, params: dict[str, Any]) -> None:
        from mlflow.entities import Param

        self._enqueue([Param(key, str(value)[:6000]) for key, value in flatten(redact_params(params)).items()])

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self._enqueue([Metric(key, float(value), now, step) for key, value in metrics.items()])

    def log_model(self, directory: Path) -> None:
        """Upload the exported HF directory as the `model` artifact; register it when configured.

        Not in a pipeline (a run nested under a parent): there the registration gate logs the model once,
        as an MLflow model in place of the exported copy (components/register), not a copy per stage.
        """
        if not self.config.log_model or self.parent_run_id:
            return
        self.flush(timeout=self._wait_budget())
        if self._is_unreachable:
            logger.warning("MLflow unreachable: the model was not logged (it is in %s)", directory)
            return
        try:
            self.client.log_artifacts(self.run_id, str(directory), "model")
            if self.config.registered_model_name:
                self._register(self.config.registered_model_name)
        except Exception as err:  # noqa: BLE001 - any tracking failure must leave training alone
            self._failures += 1
            logger.warning("could not log the model to MLflow: %s", redact_text(str(err)))

    def _register(self, name: str) -> None:
        from mlflow.exceptions import MlflowException

        try:
            self.client.create_registered_model(name)
        except MlflowException:
            pass  # already registered: add a version
        source = f"{self.client.get_run(self.run_id).info.artifact_uri}/model"
        version = self.client.create_model_version(name, source, run_id=self.run_id)
        logger.info("registered model %s version %s", name, version.version)

    def close(self) -> None:
        if self._system_monitor is not None:
            self._system_monitor.finish()
        unsent = self.flush(timeout=self._wait_budget())
        with self._lock:
            self._closing = True
            self._lock.notify_all()
        if not self._is_unreachable:
            try:
                self.client.set_terminated(self.run_id)
            except Exception as err:  # noqa: BLE001
                self._failures += 1
                logger.warning("could not mark MLflow run %s finished: %s", self.run_id, redact_text(str(err)))
        if unsent or self._dropped or self._failures:
            logger.warning("MLflow: %d values not sent, %d dropped, %d failed calls (all metrics are in "
                           "metrics.jsonl)", unsent, self._dropped, self._failures)

    # -- sending ------------------------------------------------------------------------------------

    def _wait_budget(self) -> float:
        """How long to wait for the queue: the full budget normally, one retry during an outage."""
        return 5.0 if self._is_unreachable else CLOSE_TIMEOUT_SECONDS

    def _enqueue(self, items: list[Any]) -> None:
        with self._lock:
            room = MAX_QUEUED - len(self._queue)
            self._dropped += max(0, len(items) - room)
            self._queue.extend(items[:max(room, 0)])
            self._lock.notify_all()

    def flush(self, timeout: float = CLOSE_TIMEOUT_SECONDS) -> int:
        """Wait up to `timeout` seconds for queued values to be sent; return how many remain."""
        deadline = time.monotonic() + timeout
        with self._lock:
            self._flushing += 1
            self._lock.notify_all()
            try:
                while self._queue and time.monotonic() < deadline:
                    self._lock.wait(timeout=0.1)
                return len(self._queue)
            finally:
                self._flushing -= 1

    def _send_loop(self) -> None:
        from mlflow.entities import Param

        delay, warned = 1.0, False
        while True:
            with self._lock:
                while not self._closing:
                    wait = self._next_send - time.monotonic()
                    if self._queue and (wait <= 0 or self._flushing or len(self._queue) >= SEND_BATCH):
                        break
                    self._lock.wait(timeout=wait if self._queue else None)
                if self._closing:
                    return
                batch = self._queue[:SEND_BATCH]
                self._next_send = time.monotonic() + SEND_INTERVAL_SECONDS
            params = [item for item in batch if isinstance(item, Param)]
            metrics = [item for item in batch if not isinstance(item, Param)]
            try:
                self.client.log_batch(self.run_id, metrics=metrics, params=params)
            except Exception as err:  # noqa: BLE001 - an outage: keep the values and retry
                self._failures += 1
                self._is_unreachable = True
                if not warned:
                    logger.warning("MLflow unreachable (%s); buffering metrics and retrying", redact_text(str(err)))
                    warned = True
                time.sleep(delay)
                delay = min(delay * 2, 30.0)
                continue
            if warned:
                logger.info("MLflow reachable again; sending buffered metrics")
            delay, warned, self._is_unreachable = 1.0, False, False
            with self._lock:
                del self._queue[:len(batch)]
                self._lock.notify_all()
