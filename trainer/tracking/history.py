"""What a run's metric history (`metrics.jsonl`) says at its end: the values logged at a step, and
whether the loss curve shows a run that learned nothing.

The loss check warns, it never fails a run: a loss that does not fall, or one that grows by orders
of magnitude, usually means a learning rate far off or broken data, but only the user can tell
(a model that already fits its data has a flat loss too). It judges the logged `loss` of the whole
run, resumed attempts included, once at least `MIN_POINTS` finite values were logged (with
`train.log_interval` 10, a run of 60 steps). Each end of the curve is the mean of a window of a
fifth of the points (two at least, so that one noisy step does not decide):

- not falling: the last window's mean is less than 1% below the first window's;
- growing by orders of magnitude: a point is 100 times the first window's mean or more.

Only the supervised stages are judged: the online stages' policy loss is a surrogate that need not
fall (their reward and KL curves tell how they went). Non-finite losses are left out here: they
have their own guard (`train.max_nonfinite_steps`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

MIN_POINTS = 6
WINDOW_DIVISOR = 5  # each end window holds a fifth of the points
MIN_WINDOW = 2
MIN_RELATIVE_FALL = 0.01
GROWTH_FACTOR = 100.0


def read_history(path: Path) -> list[dict[str, Any]]:
    """The records of a local metrics file, in order ([] when there is none)."""
    return parse_records(path.read_text(errors="replace")) if path.is_file() else []


def parse_records(text: str) -> list[dict[str, Any]]:
    """The JSON objects of a metrics text, one a line; other lines (a line cut by a kill) are left out."""
    records = []
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def logged_at(history: list[dict[str, Any]], step: int) -> dict[str, Any]:
    """Every value logged at `step` (nulls left out), merged in logging order."""
    merged: dict[str, Any] = {}
    for record in history:
        if record.get("step") == step:
            merged.update((key, value) for key, value in record.items() if key != "step" and value is not None)
    return merged


def loss_warnings(history: list[dict[str, Any]], key: str = "loss") -> list[str]:
    """One warning per way the logged `key` curve looks unhealthy (see the module docstring); [] if healthy or too short."""
    points = [(record.get("step"), float(record[key])) for record in history
              if isinstance(record.get(key), (int, float)) and not isinstance(record[key], bool)
              and math.isfinite(record[key])]
    if len(points) < MIN_POINTS:
        return []
    width = max(MIN_WINDOW, len(points) // WINDOW_DIVISOR)
    first = sum(value for _, value in points[:width]) / width
    last = sum(value for _, value in points[-width:]) / width
    peak_step, peak = max(points, key=lambda point: point[1])
    if first > 0 and peak >= GROWTH_FACTOR * first:
        return [f"{key} grew by orders of magnitude: from {first:.4g} (mean of the first {width} logged points) to "
                f"{peak:.4g} at step {peak_step}, and ended at {last:.4g}; the run diverged: lower optimizer.lr, or "
                "check the data"]
    if last > first - MIN_RELATIVE_FALL * abs(first):
        return [f"{key} did not fall over the run: {first:.4g} over the first {width} logged points, {last:.4g} over "
                f"the last {width} (steps {points[0][0]} to {points[-1][0]}); the model may have learned nothing: "
                "check optimizer.lr and the data"]
    return []
