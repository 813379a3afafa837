"""The garbage collector in a trainer process: off while a stage starts, on again once it has (or setup failed),
and out of the way at exit."""

from __future__ import annotations

import gc
import logging
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import make_config
from trainer.errors import AlignflowError
from trainer.lifecycle import collector


@pytest.fixture
def collections():
    """Collection left on (and nothing paused) after the test, whatever it did."""
    yield
    collector.resume()
    gc.enable()


class StepLines(logging.Handler):
    """Whether automatic collection was on when each training step's log line was written."""

    def __init__(self) -> None:
        super().__init__()
        self.collecting: list[bool] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("step "):
            self.collecting.append(gc.isenabled())


def test_a_paused_stage_collects_again_during_its_steps(tmp_path, tiny_model, task_files, collections):
    from trainer.supervised.stages import run_stage

    lines, loop_logger = StepLines(), logging.getLogger("trainer.supervised.loop")
    level = loop_logger.level
    loop_logger.setLevel(logging.INFO)
    loop_logger.addHandler(lines)
    collector.pause_while_starting()
    assert not gc.isenabled() and collector.is_paused()
    try:
        run_stage(make_config("sft", tmp_path, tiny_model, task_files["sft_train"], None,
                              train={"max_epochs": 1, "micro_batch_size": 4, "log_interval": 5}))
    finally:
        loop_logger.removeHandler(lines)
        loop_logger.setLevel(level)
    assert gc.isenabled() and not collector.is_paused()
    assert lines.collecting and all(lines.collecting), lines.collecting


def test_a_stage_whose_setup_fails_turns_collection_back_on(tmp_path, tiny_model, collections):
    from trainer.supervised.stages import run_stage

    missing = tmp_path / "missing.jsonl"
    collector.pause_while_starting()
    with pytest.raises(AlignflowError, match="missing.jsonl"):
        run_stage(make_config("sft", tmp_path / "out", tiny_model, missing, None))
    assert gc.isenabled() and not collector.is_paused()


def test_the_entry_turns_collection_back_on_when_the_config_is_bad(tmp_path, collections):
    from trainer.__main__ import main

    (tmp_path / "sft.yaml").write_text("model: {path: /nowhere}\ntrain: {max_epochs: -1}\n")
    assert main(["sft", "--config", str(tmp_path / "sft.yaml")]) == 2  # paused, then failed before any setup
    assert gc.isenabled() and not collector.is_paused()


def test_resume_leaves_a_collector_someone_else_turned_off_alone(collections):
    gc.disable()
    collector.pause_while_starting()  # already off: not the pause's to undo
    collector.resume()
    assert not gc.isenabled()


def test_exit_skips_the_last_walk_for_cycles_but_runs_the_handlers_registered_after(tmp_path):
    """An object in a reference cycle is only ever freed by a collection; after `freeze_at_exit` the exit's
    collection leaves it alone, while atexit handlers registered later still run and a file written with
    `with` is complete. With nanobind's triton bindings loaded (a stand-in module here; the vLLM environment's
    pipeline test checks the real one's log) the exit unfreezes even what was frozen before, and collects."""
    script = textwrap.dedent(f"""
        import atexit, gc, sys
        from trainer.lifecycle import collector

        gc.disable()  # no collection before the exit's
        if sys.argv[1] != "default":
            collector.freeze_at_exit()
        if sys.argv[1] == "nanobind":
            import types
            sys.modules["triton._C.libtriton"] = types.ModuleType("triton._C.libtriton")

        class InCycle:
            def __del__(self):
                open({str(tmp_path / "collected")!r}, "w").close()

        cycle = InCycle()
        cycle.me = cycle
        del cycle
        if sys.argv[1] == "nanobind":
            gc.freeze()  # as a stage's setup (collector.resume) or vLLM's start does
        atexit.register(lambda: open({str(tmp_path / "handler")!r}, "w").close())
        with open({str(tmp_path / "written")!r}, "w") as out:
            out.write("x" * 100_000)
        gc.enable()  # the interpreter collects at exit only when collection is on
    """)
    for mode in ("default", "freeze", "nanobind"):
        done = subprocess.run([sys.executable, "-c", script, mode], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert (tmp_path / "collected").exists() == (mode != "freeze"), mode
        assert (tmp_path / "handler").exists() and (tmp_path / "written").stat().st_size == 100_000
        for name in ("collected", "handler", "written"):
            (tmp_path / name).unlink(missing_ok=True)
