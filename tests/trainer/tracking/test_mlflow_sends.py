"""MLflow's sends: a run's per-step metrics go to the store in a few calls, not one per step, and every value
arrives by the end of the run without waiting out the send interval."""

from __future__ import annotations

import time

from trainer.config.sections import TrackingConfig
from trainer.tracking.mlflow_tracker import SEND_INTERVAL_SECONDS, MlflowTracker
from trainer.tracking.tracker import build_tracker

STEPS = 40
METRICS = ("loss", "perf/time/generate", "perf/time/update")


def test_per_step_metrics_are_sent_together_and_all_arrive_when_the_run_closes(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    (tmp_path / "run").mkdir()
    tracker = build_tracker(tmp_path / "run", True, TrackingConfig(backend="mlflow", experiment_name="sends"), "grpo")
    (mlflow,) = [t for t in tracker.trackers if isinstance(t, MlflowTracker)]
    calls = []  # the metrics of each call the sender makes to the real store
    send = mlflow.client.log_batch
    mlflow.client.log_batch = lambda run_id, metrics=(), **kw: calls.append(len(metrics)) or send(run_id, metrics, **kw)
    started = time.monotonic()
    for step in range(1, STEPS + 1):  # a run of short steps: all of them inside one send interval
        tracker.log_metrics({name: step / 10 for name in METRICS}, step)
        time.sleep(0.01)
    assert time.monotonic() - started < SEND_INTERVAL_SECONDS
    closing = time.monotonic()
    tracker.close()  # sends what is queued at once, not after the interval
    assert time.monotonic() - closing < SEND_INTERVAL_SECONDS
    assert sum(calls) == STEPS * len(METRICS) and len([c for c in calls if c]) <= 2, calls
    history = mlflow.client.get_metric_history(mlflow.run_id, "perf/time/update")
    assert sorted(m.step for m in history) == list(range(1, STEPS + 1))
