"""The progress line of `alignflow run`, fed the log messages kfp.local writes (with their colours)."""

from __future__ import annotations

import logging

from pipelines.local_run import _TaskProgress


class RecordingStatus:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def update(self, text: str) -> None:
        self.lines.append(text)


def record(message: str) -> logging.LogRecord:
    return logging.LogRecord("root", logging.INFO, __file__, 1, message, None, None)


def test_progress_names_the_running_task_and_those_done():
    status = RecordingStatus()
    progress = _TaskProgress(status)
    for message in ["Executing task \x1b[96m'train-sft'\x1b[0m",
                    "Task \x1b[96m'train-sft'\x1b[0m finished with status \x1b[92mSUCCESS\x1b[0m",
                    "Executing task \x1b[96m'train-dpo'\x1b[0m", "[master-0] step 3/10 loss 0.5"]:
        assert progress.filter(record(message))  # every record still goes through
    assert len(status.lines) == 2
    assert status.lines[0].startswith("[bold]train-sft[/] running") and "done: -" in status.lines[0]
    assert status.lines[1].startswith("[bold]train-dpo[/] running") and "done: train-sft" in status.lines[1]


def test_the_closing_summary_keeps_its_columns_aligned_for_long_task_names():
    from pipelines.local_run import format_summary

    summary = {"sft": {"seconds": 3.25, "metrics": {"eval_loss": 0.5}, "model": "/root/sft/model"},
               "train-reward-model-with-a-long-name": {"seconds": 112.0, "metrics": {"eval_accuracy": 0.95,
                                                                                    "eval_loss": 0.25},
                                                       "model": "/root/rm/model"},
               "finish-run": {"seconds": 0.5, "metrics": {}, "model": ""}}
    lines = format_summary(summary, 116.0).splitlines()
    header, rows = lines[0], lines[1:-1]
    # Every column starts where its header does: time right-aligned under `time`, metrics and model under theirs.
    for column in ("key metrics", "model"):
        start = header.index(column)
        assert all(row[start - 2:start] == "  " and row[start] != " " for row in rows if len(row) > start), column
    time_end = header.index("time") + len("time")
    assert [row[:time_end].split()[-1] for row in rows] == ["3.2s", "112.0s", "0.5s"]
    assert lines[-1] == "total 116 s"
