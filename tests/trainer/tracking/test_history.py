"""Judging a run's loss curve from its history, and reading the values logged at a step."""

from __future__ import annotations

import pytest

from trainer.tracking.history import logged_at, loss_warnings, read_history


def history(values: list[float | None], key: str = "loss") -> list[dict]:
    return [{"step": step, key: value} for step, value in enumerate(values, start=1)]


def test_a_falling_loss_draws_no_warning():
    assert loss_warnings(history([4.6, 4.4, 4.1, 3.9, 3.7, 3.6, 3.5, 3.5, 3.4, 3.4])) == []


def test_a_flat_loss_is_reported_with_its_window_means():
    # What `optimizer.lr: 1e6` does to the tiny model: one step to a uniform distribution, then flat.
    (warning,) = loss_warnings(history([4.668] + [4.615] * 9))
    # 10 points: windows of 2; first (4.668 + 4.615) / 2 = 4.6415, last 4.615: a fall of 0.57% < 1%.
    assert warning.startswith("loss did not fall over the run: 4.642 over the first 2 logged points, 4.615 over "
                              "the last 2 (steps 1 to 10)")


def test_a_fall_of_one_percent_is_enough():
    assert loss_warnings(history([1.0, 1.0, 1.2, 0.8, 0.99, 0.99])) == []  # 1.0 -> 0.99: fell 1%
    assert len(loss_warnings(history([1.0, 1.0, 1.2, 0.8, 0.995, 0.995]))) == 1


def test_growth_by_two_orders_of_magnitude_is_reported_once_with_its_peak():
    values = [4.67, 7.24, 91_100.5, 296_572.7, 189_090.3, 391_321.2]  # `optimizer.lr: 100`, nearly
    (warning,) = loss_warnings(history(values))
    assert warning.startswith("loss grew by orders of magnitude: from 5.955 (mean of the first 2 logged points) to "
                              "3.913e+05 at step 6, and ended at 2.902e+05")


def test_a_spike_below_a_hundredfold_is_not_growth():
    assert loss_warnings(history([2.0, 2.0, 150.0, 1.5, 1.2, 1.0])) == []


def test_too_few_points_and_non_finite_values_are_not_judged():
    assert loss_warnings(history([4.6] * 5)) == []                                       # fewer than 6 points
    assert loss_warnings(history([4.6, None, float("nan"), 4.6, 4.6, 4.6, 4.6])) == []  # 5 finite points
    assert loss_warnings([{"step": 1, "eval/loss": 1.0}] * 8) == []            # no `loss` at all


@pytest.mark.parametrize(("values", "warned"), [([-1.0, -1.1, -1.2, -1.5, -1.8, -2.0], False),
                                               ([-2.0, -2.0, -2.0, -1.9, -1.8, -1.8], True)])
def test_a_negative_loss_is_judged_by_its_fall_only(values, warned):
    assert bool(loss_warnings(history(values))) is warned


def test_values_logged_at_a_step_are_merged_and_nulls_dropped(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "loss": 1.0, "lr": null}\n{"step": 2, "eval/loss": 1.5}\n'
                    '[1, 2]\n{"step": 3, "lo')
    records = read_history(path)
    assert len(records) == 3  # not an object, and a cut line: left out
    assert logged_at(records, 2) == {"loss": 1.0, "eval/loss": 1.5}
    assert read_history(tmp_path / "missing.jsonl") == []
