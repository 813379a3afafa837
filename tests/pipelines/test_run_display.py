"""What a person sees of a run that is not on a terminal (a pipe, CI): a line per task start and end."""

from __future__ import annotations

import io

from rich.console import Console

from pipelines.run_display import RunDisplay


def test_a_line_per_start_and_end_with_the_jobs_last_step_and_a_failures_log(tmp_path):
    out = io.StringIO()
    log = tmp_path / "train-dpo.log"
    log.write_text("".join(f"line {n}\n" for n in range(30)) + "ValueError: boom\n")
    with RunDisplay(Console(file=out, width=40)) as display:
        display.started("train-sft", tmp_path / "train-sft.log")
        display.progress("train-sft", "step 10/75 loss 2.75")
        display.progress("train-sft", "step 75/75 loss 0.81")
        display.finished("train-sft", True, tmp_path / "train-sft.log")
        display.started("train-dpo", log)
        display.finished("train-dpo", False, log)
        display.note("condition-2", "skipped: condition evaluated to False")
    lines = out.getvalue().splitlines()
    assert lines[:3] == ["train-sft started", "train-sft done in 0 s (step 75/75 loss 0.81)", "train-dpo started"]
    # One line however narrow the console: the path is whole, to copy.
    assert lines[3] == f"train-dpo FAILED after 0 s; its log: {log}"
    assert lines[4:-1] == [f"    line {n}" for n in range(19, 30)] + ["    ValueError: boom"]
    assert lines[-1] == "condition-2 skipped: condition evaluated to False"


def test_quiet_shows_nothing(tmp_path):
    out = io.StringIO()
    with RunDisplay(Console(file=out), quiet=True) as display:
        display.started("train-sft", tmp_path / "x.log")
        display.finished("train-sft", False, tmp_path / "x.log")
    assert out.getvalue() == ""
