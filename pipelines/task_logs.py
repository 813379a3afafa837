"""A local run's executor logs, one file per task, and the few events a person wants to see from them.

kfp.local runs each task as a subprocess and prints all it says (the executor's input, the
component's own logs, the training job's output) to this process's stdout, between its log lines
"Executing task 'x'" and "Task 'x' finished with status S" (kfp/local/task_dispatcher.py); its
warnings and its retries ("Task x failed (attempt 1/3)") go to stderr and the root logger.
`capture_task_logs` stands in for stdout and stderr while a run lasts: every line goes to
`<directory>/<task>.log` of the task running then (lines between tasks to `pipeline.log`), and the
lines that matter are turned into events for a `RunDisplay` (pipelines/run_display.py): a task
started or finished, a training job logged a step or an episode, a task is retried or skipped.

Redirecting the streams is the one hook kfp.local offers: it writes with `print` and with a logging
handler it creates on `sys.stdout` for each task, and has no option for where task output goes.
Nothing here changes what runs, only where its output is written.
"""

from __future__ import annotations

import contextlib
import io
import logging
import re
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from pipelines.run_display import RunDisplay

COLOUR = re.compile(r"\x1b\[[0-9;]*m")
STARTED = re.compile(r"Executing task '([\w-]+)'")
FINISHED = re.compile(r"Task '([\w-]+)' finished with status (\w+)")
PIPELINE_FINISHED = re.compile(r"Pipeline '[\w-]+' finished with status")
RETRIED = re.compile(r"Task ([\w-]+) (failed \(attempt \d+/\d+\))\. Retrying (in [\d.]+s)")
SKIPPED = re.compile(r"Skipping (?:conditional )?task ([\w-]+)(?::| \()\s*(.*?)\)?\.?$")
# The trainer's progress lines, as a job's rank-0 replica prints them: "step 10/75 loss ...", "episode 3: reward ...".
PROGRESS = re.compile(r"\[master-0\] .*INFO trainer\.[\w.]*loop: ((?:step|episode) \d.*)")
BETWEEN_TASKS = "pipeline"


class TaskLogRouter(io.TextIOBase):
    """A text stream that files each line under the task running when it was written, and reports events.

    Args:
        directory: Where the `<task>.log` files go (created with the first line: a run that fails its
            argument checks leaves nothing behind).
        display: Told when a task starts, finishes, is retried or skipped, and of each training step.
        echo: A stream that also gets every line unchanged (`--verbose`), or None.
    """

    def __init__(self, directory: Path, display: RunDisplay, echo: IO[str] | None = None) -> None:
        super().__init__()
        self.directory = directory
        self.display = display
        self.echo = echo
        self.task = BETWEEN_TASKS
        self.pending = ""
        self.files: dict[str, IO[str]] = {}
        self.failed: list[str] = []
        self.lock = threading.Lock()  # kfp.local writes from its main thread; a library may log from another

    def log_path(self, task: str) -> Path:
        return self.directory / f"{task}.log"

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        with self.lock:
            if self.echo is not None:
                self.echo.write(text)
            *lines, self.pending = (self.pending + text).split("\n")
            for line in lines:
                self._route(line)
        return len(text)

    def flush(self) -> None:
        with self.lock:
            for handle in self.files.values():
                handle.flush()
            if self.echo is not None:
                self.echo.flush()

    def close(self) -> None:
        with self.lock:
            if self.pending:
                self._route(self.pending)
                self.pending = ""
            for handle in self.files.values():
                handle.close()
            self.files.clear()
        super().close()

    def _route(self, line: str) -> None:
        plain = COLOUR.sub("", line)
        if match := STARTED.search(plain):
            self.task = match.group(1)
            self.display.started(self.task, self.log_path(self.task))
        elif PIPELINE_FINISHED.search(plain):
            self.task = BETWEEN_TASKS  # the last task's log ends with that task
        retried = RETRIED.search(plain)  # logged after the failed attempt's end: filed with its attempts
        self._file(retried.group(1) if retried else self.task).write(plain + "\n")
        if match := FINISHED.search(plain):
            self._file(self.task).flush()  # the display may show the log's last lines
            if match.group(2) != "SUCCESS":
                self.failed.append(match.group(1))
            self.display.finished(match.group(1), match.group(2) == "SUCCESS", self.log_path(match.group(1)))
        elif match := PROGRESS.search(plain):
            self.display.progress(self.task, match.group(1).strip())
        elif retried:
            self.display.note(retried.group(1), f"{retried.group(2)}; retrying {retried.group(3)}")
        elif match := SKIPPED.search(plain):
            self.display.note(match.group(1), f"skipped: {match.group(2)}")

    def _file(self, task: str) -> IO[str]:
        if task not in self.files:
            self.directory.mkdir(parents=True, exist_ok=True)
            # Appended to: a retried task's attempts share its file. Line-buffered: `tail -f` follows a running task.
            self.files[task] = self.log_path(task).open("a", encoding="utf-8", buffering=1)
        return self.files[task]


@contextlib.contextmanager
def capture_task_logs(directory: Path, display: RunDisplay, verbose: bool = False) -> Iterator[TaskLogRouter]:
    """While the block runs, file stdout, stderr and the root logger's records per task under `directory`.

    With `verbose`, everything also goes on to this process's stdout as it did without the capture.
    The root logger is set to INFO for the block so that kfp.local's retry and skip messages, which it
    logs outside a task, reach the files too.
    """
    router = TaskLogRouter(directory, display, echo=sys.stdout if verbose else None)
    handler = logging.StreamHandler(router)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        with contextlib.redirect_stdout(router), contextlib.redirect_stderr(router):
            yield router
    finally:
        # Any handler left writing to the router (ours, or one a library's basicConfig made on the redirected
        # stderr) would write to a closed stream after the block: each record would then print a logging error.
        for stale in [h for h in root.handlers if getattr(h, "stream", None) is router]:
            root.removeHandler(stale)
        root.setLevel(level)
        router.close()
