"""The metrics file: one line per step, also across a resumed attempt that reopens it."""

from __future__ import annotations

import json

from trainer.tracking.tracker import JsonlTracker


def lines(directory) -> list[dict]:
    return [json.loads(line) for line in (directory / "metrics.jsonl").read_text().splitlines()]


def test_metrics_logged_again_for_the_same_step_are_merged_into_its_line(tmp_path):
    tracker = JsonlTracker(tmp_path)
    tracker.log_metrics({"loss": 2.0}, 1)
    tracker.log_metrics({"loss": 1.5, "lr": 0.1}, 2)
    tracker.log_metrics({"eval/loss": 1.7}, 2)              # an epoch's eval after its last step
    tracker.log_metrics({"time/save_checkpoint": 0.25}, 2)  # a checkpoint's save time
    tracker.log_metrics({"loss": float("nan")}, 3)
    tracker.log_metrics({"lr": 0.05}, 3)
    tracker.close()
    assert lines(tmp_path) == [
        {"step": 1, "loss": 2.0},
        {"step": 2, "loss": 1.5, "lr": 0.1, "eval/loss": 1.7, "time/save_checkpoint": 0.25},
        {"step": 3, "loss": None, "lr": 0.05},  # strict JSON: NaN is null
    ]


def test_a_reopened_file_merges_into_its_last_line_and_appends_after_it(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "loss": 1.5}\n')
    tracker = JsonlTracker(tmp_path)  # a resumed attempt whose history ends at the step it logs again
    tracker.log_metrics({"eval/reward": 0.5}, 2)
    tracker.log_metrics({"loss": 1.0}, 3)
    tracker.close()
    assert lines(tmp_path) == [{"step": 1, "loss": 2.0}, {"step": 2, "loss": 1.5, "eval/reward": 0.5},
                               {"step": 3, "loss": 1.0}]


def test_a_cut_last_line_is_left_alone(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "lo')
    tracker = JsonlTracker(tmp_path)
    tracker.log_metrics({"loss": 1.5}, 2)
    tracker.close()
    assert (tmp_path / "metrics.jsonl").read_text().splitlines() == ['{"step": 1, "loss": 2.0}', '{"step": 2, "lo',
                                                                   '{"step": 2, "loss": 1.5}']
