"""Shared fixtures: the tiny model and task written once per session, and config builders."""

from __future__ import annotations

import copy
import importlib.util
import logging
import os
import signal
import sys
from pathlib import Path

# OpenMP's threads spin while they wait for work by default. When two processes each run torch's threads on the
# same cores (the two test workers, a trainer beside its server or its torchrun agent), each spins on the cores the
# other needs: two tiny rlhf-grpo runs side by side took 224 s here against 44 s for one alone, and 46 s with
# passive waiting (the same numbers; waiting does not change what is computed). Set before torch is loaded, in this
# process and, inherited, in every process a test starts (docs/testing.md).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest  # noqa: E402

from trainer.config import StageConfig, build_config  # noqa: E402
from trainer.tiny.model import write_tiny_model  # noqa: E402
from trainer.tiny.task import write_task  # noqa: E402


def pytest_configure(config):
    # KFP builds a pipeline's graph when its module is imported, and each resource setter on a task calls
    # inspect.stack(), whose cost grows with the number of modules loaded. Imported late in the session (after
    # MLflow, boto3, transformers' model families) the five pipelines took 20-36 s; before collection, 3 s.
    # make test-colossalai's environment has no KFP (and no pipeline tests).
    if importlib.util.find_spec("kfp") is not None:
        from pipelines.catalog import pipelines

        pipelines()


@pytest.fixture(autouse=True)
def root_logger_left_as_found():
    """Drop the stream handlers a test's in-process entry point added to the root logger (`logging.basicConfig`).

    Such a handler keeps writing to the stream of the test that made it, which pytest closes: every later record
    then prints a logging error onto whatever stderr is at that time, which a later test may be reading.
    """
    root = logging.getLogger()
    before, level = list(root.handlers), root.level
    yield
    for handler in [h for h in root.handlers if type(h) is logging.StreamHandler and h not in before]:
        root.removeHandler(handler)
    root.setLevel(level)


@pytest.fixture(autouse=True)
def no_s3_client_outlives_its_test():
    """Forget the process's shared S3 client after each test: it was made for that test's endpoint and credentials."""
    yield
    storage = sys.modules.get("trainer.storage.s3")
    if storage is not None:
        storage.S3Storage._shared = None


@pytest.fixture(autouse=True)
def signal_handlers_left_as_found():
    """Put back the SIGTERM/SIGINT handlers a test's in-process trainer left installed (trainer.lifecycle.preemption).

    Left in place, the next test that installs them records the trainer's handler as the one to restore.
    """
    before = {number: signal.getsignal(number) for number in (signal.SIGTERM, signal.SIGINT)}
    yield
    for number, handler in before.items():
        if signal.getsignal(number) is not handler:
            from trainer.lifecycle import preemption

            preemption.uninstall()  # forgets the handlers it replaced, so its next install starts clean
            signal.signal(number, handler)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="session")
def task_files(tmp_path_factory) -> dict[str, Path]:
    return write_task(tmp_path_factory.mktemp("task"))


def merge(base: dict, updates: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in updates.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def stage_dict(stage: str, output_dir: Path, model: Path, train_file: Path, eval_file: Path | None = None, /,
               **updates) -> dict:
    """A small, fast config mapping for `stage`; `updates` are merged section by section."""
    base = {
        "output_dir": str(output_dir),
        "model": {"path": str(model)},
        "data": {"train_path": str(train_file), "eval_path": str(eval_file) if eval_file else None, "max_length": 32},
        "optimizer": {"lr": 2e-3, "warmup_steps": 2},
        "train": {"micro_batch_size": 10, "log_interval": 1000},
        "checkpoint": {"keep_last": 0},
        "tracking": {"backend": "none"},  # MLflow has its own tests (tests/integration/test_tracking.py)
    }
    if stage in ("sft", "rm", "dpo", "kto", "orpo"):
        base["train"]["max_epochs"] = 1  # online stages have no epochs: their length is num_episodes
    return merge(base, updates)


def make_config(stage: str, *args, **updates) -> StageConfig:
    return build_config(stage, stage_dict(stage, *args, **updates))


@pytest.fixture(scope="session")
def sft_model(tmp_path_factory, tiny_model, task_files) -> Path:
    """The tiny model after SFT on the addition task (`<output>/model`): the start of the RM and DPO tests."""
    from trainer.supervised.stages import run_stage

    output = tmp_path_factory.mktemp("sft")
    config = make_config("sft", output, tiny_model, task_files["sft_train"], task_files["sft_eval"],
                         optimizer={"lr": 3e-3, "warmup_steps": 5}, train={"max_epochs": 60, "micro_batch_size": 16})
    run_stage(config)
    return output / "model"


@pytest.fixture(scope="session")
def rl_start_model(tmp_path_factory, tiny_model, task_files) -> Path:
    """A briefly fine-tuned model that knows the format but not all sums: room for PPO/GRPO to improve."""
    from trainer.supervised.stages import run_stage

    output = tmp_path_factory.mktemp("sft-short")
    config = make_config("sft", output, tiny_model, task_files["sft_train"], None,
                         optimizer={"lr": 3e-3, "warmup_steps": 5}, train={"max_epochs": 20, "micro_batch_size": 16})
    run_stage(config)
    return output / "model"
