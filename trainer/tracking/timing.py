"""Where an online step's time goes: wall-clock seconds per named phase, as `perf/` metrics.

The online stages time each episode's phases (sampling, scoring, the log-prob and value forwards,
the update, the weight sync into the rollout engine) with one `PhaseTimer` and log them with the
episode's throughput, so a slow run says which part is slow (verl's `timing_s/*` keys, under our
`perf/` namespace).

Each phase ends on a host synchronisation already (sampled ids come back to the host, the update
reads its loss), so plain wall-clock time is the phase's time on a GPU too; nothing here adds a
device synchronisation of its own.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager

PHASES = ("generate", "score", "logps_old", "logps_ref", "values", "update", "sync_weights")
"""The phases an online step reports, in the order a step runs them (`perf/time/<phase>`)."""


class PhaseTimer:
    """Seconds spent in each phase since the last `reset`, and the time since then in all."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.started = time.perf_counter()

    def reset(self) -> None:
        """Start a new step: every phase back to 0."""
        self.seconds.clear()
        self.started = time.perf_counter()

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Add the block's wall-clock time to phase `name` (also when it raises)."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] += time.perf_counter() - start

    def add(self, other: PhaseTimer) -> None:
        """Add `other`'s phase seconds to this timer's (a part of the step timed on its own)."""
        for name, seconds in other.seconds.items():
            self.seconds[name] += seconds

    def metrics(self, *, tokens: float, completions: float) -> dict[str, float]:
        """`perf/time/<phase>` for every phase in `PHASES` (0 where it did not run) and any other timed phase, `perf/time/step` (the whole
        step, phases and everything between them), and the step's throughput: `perf/tokens_per_second` (response
        tokens) and `perf/completions_per_second`.

        Args:
            tokens: Response tokens generated in the step (all ranks).
            completions: Responses generated in the step (all ranks).
        """
        step = max(time.perf_counter() - self.started, 1e-9)
        seconds = {**dict.fromkeys(PHASES, 0.0), **self.seconds}
        metrics = {f"perf/time/{name}": value for name, value in seconds.items()}
        metrics.update({"perf/time/step": step, "perf/tokens_per_second": tokens / step,
                        "perf/completions_per_second": completions / step})
        return metrics
