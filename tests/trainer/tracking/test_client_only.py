"""Tracking with MLflow's client alone (mlflow-skinny, the trainer image's install), where no local store exists."""

from __future__ import annotations

import sys


def test_a_client_only_install_without_a_tracking_uri_trains_untracked_with_one_warning(tmp_path, monkeypatch, caplog):
    """The trainer image has mlflow-skinny, MLflow's client without its local (sqlalchemy) store: without a tracking
    URI there is nowhere to track, which the warning says, instead of a failure deep inside MLflow."""
    from trainer.config.sections import TrackingConfig
    from trainer.tracking.tracker import build_tracker

    monkeypatch.setitem(sys.modules, "sqlalchemy", None)  # import sqlalchemy now fails, as where it is not installed
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)
    tracker = build_tracker(tmp_path, True, TrackingConfig(backend="mlflow"), "sft")
    tracker.close()
    assert [type(t).__name__ for t in tracker.trackers] == ["JsonlTracker"]
    [warning] = [r.getMessage() for r in caplog.records if "MLflow tracking disabled" in r.getMessage()]
    assert "client only" in warning and "set MLFLOW_TRACKING_URI" in warning
    assert not (tmp_path / "mlflow.db").exists()
