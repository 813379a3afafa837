"""Environments the agent tests register through ALIGNFLOW_ENVIRONMENTS (as a platform would)."""

import contextlib
import threading
import time

from trainer.agents.environment import Environment, Observation


class EchoEnvironment(Environment):
    """Never ends: answers every turn with the user message `go N` (N the turn number)."""

    def step(self, turn):
        self.turns = getattr(self, "turns", 0) + 1
        return Observation(messages=[{"role": "user", "content": f"go {self.turns}"}])


class EndsOnOddRowsEnvironment(Environment):
    """Ends after the first turn where the row's `answer` is odd, else never (so episodes finish at different turns)."""

    def step(self, turn):
        return Observation(messages=[{"role": "user", "content": "more"}], done=int(self.row["answer"]) % 2 == 1,
                           reward=0.5)


class SlowEnvironment(Environment):
    """Takes 0.3 s to answer, then ends."""

    def step(self, turn):
        time.sleep(0.3)
        return Observation(done=True)


class BrokenEnvironment(Environment):
    def step(self, turn):
        raise RuntimeError("bug in the environment")


def hang(seconds: float) -> str:
    """Sleep (a tool that hangs)."""
    time.sleep(seconds)
    return "woke"


class MarkedEchoEnvironment(EchoEnvironment):
    """`EchoEnvironment` that appends a line to the file AGENT_TEST_MARKER at every step (so a test can kill a
    run in the middle of an episode), and `start <prompt>` when an episode starts (so it can tell which prompts
    each rollout ran)."""

    def start(self, row):
        super().start(row)
        mark(f"start {row['prompt']}")

    def step(self, turn):
        mark("step")
        return super().step(turn)


def mark(line):
    import os

    with open(os.environ["AGENT_TEST_MARKER"], "a") as marker:
        marker.write(line + "\n")


def shorter_answers(prompt: str, completion: str, answer: str | None) -> float:
    """A reward that differs between an episode's samples from the first step: the shorter the last turn, the more."""
    return -len(completion) / 8


class ConcurrencyGauge:
    """Counts the steps running at once (shared by the rows of one test) and keeps the highest count seen."""

    def __init__(self):
        self.lock = threading.Lock()
        self.running = 0
        self.peak = 0

    def __enter__(self):
        with self.lock:
            self.running += 1
            self.peak = max(self.peak, self.running)

    def __exit__(self, *exc):
        with self.lock:
            self.running -= 1


class Latch:
    """Opens when `count` episodes have ended (shared by the rows of one test)."""

    def __init__(self, count):
        self.lock = threading.Lock()
        self.count = count
        self.opened = threading.Event()

    def count_down(self):
        with self.lock:
            self.count -= 1
            if self.count == 0:
                self.opened.set()


class ScriptedEnvironment(Environment):
    """Does what its row says, deterministically: ends after `turns` turns (default 1), answering `go N` before;
    sleeps `sleeps[N-1]` seconds at step N; raises at step `fails_at_turn`; counts itself in `gauge`; records each
    step's (start, end) monotonic time in `steps`; with `latch`, a row with `waits_for_others` waits at its first
    step until the latch opens (up to 10 s) and records whether it did in `released`, and every other row counts
    the latch down when it ends; with `gate` (a threading.Event), its first step waits until the gate opens (up to
    10 s)."""

    def step(self, turn):
        row = self.row
        self.turns = getattr(self, "turns", 0) + 1
        start = time.monotonic()
        with row.get("gauge") or contextlib.nullcontext():
            if self.turns == row.get("fails_at_turn"):
                raise RuntimeError(f"scripted failure at turn {self.turns}")
            if row.get("waits_for_others"):
                row["released"] = row["latch"].opened.wait(10)
            if row.get("gate") is not None and self.turns == 1:
                row["gate"].wait(10)
            time.sleep(row.get("sleeps", [0.0] * 99)[self.turns - 1])
        row.setdefault("steps", []).append((start, time.monotonic()))
        done = self.turns >= row.get("turns", 1)
        if done and "latch" in row and not row.get("waits_for_others"):
            row["latch"].count_down()
        return Observation(messages=[{"role": "user", "content": f"go {self.turns}"}], done=done)


class OneStepAtATimeEnvironment(ScriptedEnvironment):
    """`ScriptedEnvironment` that lets only one of its episodes step at a time."""

    max_concurrent_steps = 1


class GatedEnvironment(Environment):
    """Two turns: answers `go on` to the first, ends at the second. A row whose prompt is a key of `GATES` waits at
    its first step until that event is set (up to 20 s), so a test decides which episodes are still running."""

    GATES: dict = {}

    def step(self, turn):
        self.turns = getattr(self, "turns", 0) + 1
        gate = self.GATES.get(str(self.row["prompt"]))
        if gate is not None and self.turns == 1:
            gate.wait(20)
        return Observation(messages=[{"role": "user", "content": "go on"}], done=self.turns == 2)
