"""What `alignflow run` shows while a pipeline runs: a line per task as it starts and as it ends.

On a terminal the running task and its training job's latest step stay on one live status line
(rich), and only the ends are printed; elsewhere (a pipe, CI) each start is printed too, and each
end carries the job's last step. A failed task prints its log file and that log's last lines.
The executor logs themselves are in files (pipelines/task_logs.py); `--verbose` shows them instead.
"""

from __future__ import annotations

import time
from collections import deque
from pathlib import Path
from typing import Any

FAILED_TAIL_LINES = 12


class RunDisplay:
    """Tells a person how a run goes, from the events `TaskLogRouter` reports.

    Args:
        console: A rich Console (on the terminal's stderr; the run's own stdout is captured).
        quiet: Print nothing (`--verbose`: the executor logs are shown instead).
    """

    def __init__(self, console: Any, quiet: bool = False) -> None:
        self.console = console
        self.quiet = quiet
        self.live = console.is_terminal and not quiet
        self.status: Any = None
        self.task = ""
        self.task_started = time.monotonic()
        self.last_progress: dict[str, str] = {}

    def __enter__(self) -> RunDisplay:
        if self.live:
            self.status = self.console.status("starting")
            self.status.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self.status is not None:
            self.status.stop()

    def say(self, text: str) -> None:
        """A line for the person (not for the logs), e.g. where the logs are."""
        if not self.quiet:
            self.console.print(text, highlight=False, markup=False, soft_wrap=True)

    def started(self, task: str, log: Path) -> None:
        self.task, self.task_started = task, time.monotonic()
        if not self.live:
            self.say(f"{task} started")
        self._refresh("")

    def progress(self, task: str, text: str) -> None:
        self.last_progress[task] = text
        self._refresh(text)

    def finished(self, task: str, succeeded: bool, log: Path) -> None:
        seconds = time.monotonic() - self.task_started
        last = f" ({self.last_progress[task]})" if task in self.last_progress else ""
        if succeeded:
            self.say(f"{task} done in {seconds:.0f} s{last}")
            return
        self.say(f"{task} FAILED after {seconds:.0f} s{last}; its log: {log}")
        for line in self._tail(log):
            self.say(f"    {line}")

    def note(self, task: str, text: str) -> None:
        """A retry or a skipped task, e.g. `train-dpo failed (attempt 1/3); retrying in 30.0s`."""
        self.say(f"{task} {text}")

    def _refresh(self, progress: str) -> None:
        if self.status is not None:
            elapsed = time.monotonic() - self.task_started
            from rich.markup import escape

            text = f"{self.task} running ({elapsed:.0f} s)" + (f": {progress}" if progress else "")
            self.status.update(escape(text))

    @staticmethod
    def _tail(log: Path) -> list[str]:
        try:
            with log.open(encoding="utf-8", errors="replace") as handle:
                return list(deque((line.rstrip() for line in handle if line.strip()), maxlen=FAILED_TAIL_LINES))
        except OSError:
            return []
