"""Each task's executor output filed under its task, from kfp.local's own logging helpers (the real line format)."""

from __future__ import annotations

import logging
import sys

from pipelines.task_logs import capture_task_logs


class RecordingDisplay:
    def __init__(self) -> None:
        self.events: list[tuple] = []

    def started(self, task, log):
        self.events.append(("started", task))

    def progress(self, task, text):
        self.events.append(("progress", task, text))

    def finished(self, task, succeeded, log):
        self.events.append(("finished", task, succeeded, log.read_text().splitlines()[-1]))

    def note(self, task, text):
        self.events.append(("note", task, text))


def run_task_as_kfp_local_does(task: str, lines: list[str], succeeded: bool = True) -> None:
    """What kfp/local/task_dispatcher.py writes around a task: its log lines, the subprocess's lines printed
    indented, and a warning on stderr (as kfp.local warns of settings that do nothing locally)."""
    from kfp.local import logging_utils, status

    with logging_utils.local_logger_context():
        logging.info(f"Executing task {logging_utils.format_task_name(task)}")
        with logging_utils.indented_print():
            for line in lines:
                print(line)
        sys.stderr.write(f"UserWarning: {task}: settings have no effect locally\n")  # as warnings.warn writes
        outcome = status.Status.SUCCESS if succeeded else status.Status.FAILURE
        logging.info(f"Task {logging_utils.format_task_name(task)} finished with status "
                     f"{logging_utils.format_status(outcome)}")


def test_each_task_gets_its_own_log_and_the_display_hears_starts_ends_steps_retries_and_skips(tmp_path, capsys):
    display = RecordingDisplay()
    with capture_task_logs(tmp_path / "logs", display):
        run_task_as_kfp_local_does("open-lineage", ["[KFP Executor] opened run abc"])
        run_task_as_kfp_local_does("train-sft", [
            "[master-0] 17:00:39 [rank0] INFO trainer.supervised.loop: step 10/75 loss 2.7522 lr 2.98e-03 57 tok/s",
            "[master-0] 17:00:40 [rank0] INFO trainer.supervised.loop: epoch 1 eval: eval/loss=2.5829"])
        logging.info("Task train-dpo failed (attempt 1/3). Retrying in 30.0s...")  # as task_executor.py logs it
        run_task_as_kfp_local_does("train-dpo", ["Traceback (most recent call last):", "ValueError: boom"],
                                   succeeded=False)
        logging.info("Skipping conditional task condition-2 (condition evaluated to False)")
    logs = tmp_path / "logs"
    assert sorted(p.name for p in logs.iterdir()) == ["open-lineage.log", "train-dpo.log", "train-sft.log"]
    sft = (logs / "train-sft.log").read_text()
    assert "    [master-0] 17:00:39 [rank0] INFO trainer.supervised.loop: step 10/75" in sft  # as kfp printed it
    assert "Executing task 'train-sft'" in sft and "\x1b[" not in sft  # kfp's own lines too, without colours
    assert "train-sft: settings have no effect locally" in sft  # stderr is filed too
    assert "opened run abc" in (logs / "open-lineage.log").read_text() and "opened run" not in sft
    assert "ValueError: boom" in (logs / "train-dpo.log").read_text()
    assert "Retrying in 30.0s" in (logs / "train-dpo.log").read_text()  # with the attempts it is about
    assert [event[:3] for event in display.events] == [
        ("started", "open-lineage"), ("finished", "open-lineage", True),
        ("started", "train-sft"), ("progress", "train-sft", "step 10/75 loss 2.7522 lr 2.98e-03 57 tok/s"),
        ("finished", "train-sft", True),
        ("note", "train-dpo", "failed (attempt 1/3); retrying in 30.0s"),
        ("started", "train-dpo"), ("finished", "train-dpo", False),
        ("note", "condition-2", "skipped: condition evaluated to False"),
    ]
    # The display hears of an end once the task's log holds it: it may show the log's last lines.
    ends = [event[3] for event in display.events if event[0] == "finished"]
    assert [end.split(" - ")[-1] for end in ends] == [
        f"Task '{task}' finished with status {outcome}" for task, outcome in
        [("open-lineage", "SUCCESS"), ("train-sft", "SUCCESS"), ("train-dpo", "FAILURE")]]
    captured = capsys.readouterr()
    assert captured.out == "" and "boom" not in captured.err  # nothing reached the terminal


def test_verbose_passes_everything_on_to_stdout_as_well(tmp_path, capsys):
    with capture_task_logs(tmp_path / "logs", RecordingDisplay(), verbose=True):
        run_task_as_kfp_local_does("train-sft", ["[master-0] hello from the job"])
    out = capsys.readouterr().out
    assert "Executing task" in out and "    [master-0] hello from the job" in out
    assert "hello from the job" in (tmp_path / "logs" / "train-sft.log").read_text()
    assert logging.getLogger().handlers == [] or all(h.stream is not sys.stdout for h in logging.getLogger().handlers
                                                    if isinstance(h, logging.StreamHandler))


def test_lines_outside_any_task_go_to_the_pipeline_log_and_silence_writes_nothing(tmp_path):
    with capture_task_logs(tmp_path / "quiet", RecordingDisplay()):
        pass
    assert not (tmp_path / "quiet").exists()  # a run that fails its checks before any output leaves no folder
    with capture_task_logs(tmp_path / "logs", RecordingDisplay()):
        print("Running pipeline: 'rlhf-dpo'")
        run_task_as_kfp_local_does("finish-run", ["[KFP Executor] closed run abc"])
        print("Pipeline 'rlhf-dpo' finished with status SUCCESS")
    assert (tmp_path / "logs" / "pipeline.log").read_text() == ("Running pipeline: 'rlhf-dpo'\n"
                                                              "Pipeline 'rlhf-dpo' finished with status SUCCESS\n")
    assert "closed run abc" in (tmp_path / "logs" / "finish-run.log").read_text()


def test_no_handler_is_left_writing_to_the_closed_log_after_the_block(tmp_path, capsys):
    with capture_task_logs(tmp_path / "logs", RecordingDisplay()):
        logging.getLogger().addHandler(logging.StreamHandler(sys.stderr))  # as a library's logging setup may
    handlers = logging.getLogger().handlers
    assert not [h for h in handlers if isinstance(h, logging.StreamHandler) and h.stream.__class__.__name__ ==
                "TaskLogRouter"]
    logging.warning("after the block")
    assert "Logging error" not in capsys.readouterr().err
