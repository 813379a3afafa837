"""`PhaseTimer`: seconds per phase of one step, and the step's throughput."""

import time

import pytest

from trainer.tracking.timing import PHASES, PhaseTimer


def test_phases_accumulate_and_a_raising_block_still_counts():
    timer = PhaseTimer()
    for _ in range(2):
        with timer.phase("generate"):
            time.sleep(0.02)
    with pytest.raises(RuntimeError), timer.phase("update"):
        time.sleep(0.01)
        raise RuntimeError("boom")
    metrics = timer.metrics(tokens=100, completions=4)
    assert metrics["perf/time/generate"] >= 0.04 and metrics["perf/time/update"] >= 0.01
    assert metrics["perf/time/score"] == 0.0  # every known phase is reported, 0 where it did not run
    assert set(metrics) >= {f"perf/time/{name}" for name in PHASES}
    step = metrics["perf/time/step"]
    assert step >= metrics["perf/time/generate"] + metrics["perf/time/update"]
    assert metrics["perf/tokens_per_second"] == pytest.approx(100 / step, rel=0.05)
    assert metrics["perf/completions_per_second"] == pytest.approx(4 / step, rel=0.05)


def test_reset_starts_a_new_step():
    timer = PhaseTimer()
    with timer.phase("score"):
        time.sleep(0.02)
    timer.reset()
    metrics = timer.metrics(tokens=0, completions=0)
    assert metrics["perf/time/score"] == 0.0 and metrics["perf/time/step"] < 0.02
