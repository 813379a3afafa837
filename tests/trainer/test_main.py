"""Tests of `python -m trainer`, run as a subprocess the way a PyTorchJob runs it.

Bad input ends with one line on stderr naming the place (file:line, dotted key or `--set` flag)
and exit code 2, before anything is written; a good config trains, exports and can be resumed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import stage_dict
from trainer.config import load_config

REPO_ROOT = Path(__file__).resolve().parents[2]


def run_trainer(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):  # a single process, whatever runs the tests
        env.pop(name, None)
    return subprocess.run([sys.executable, "-m", "trainer", *args], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def write_config(path: Path, config: dict) -> Path:
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


@pytest.fixture
def sft_config(tmp_path, tiny_model, task_files) -> dict:
    return stage_dict("sft", tmp_path / "out", tiny_model, task_files["sft_train"],
                      train={"max_steps": 4, "micro_batch_size": 8})


# -- bad input: exit 2, one line naming the place, nothing written ---------------------------------


def test_unknown_key_names_file_line_and_dotted_key(tmp_path, tiny_model, task_files):
    path = tmp_path / "run.yaml"
    path.write_text(
        f"output_dir: {tmp_path / 'out'}\n"  # 1
        "model:\n"  # 2
        f"  path: {tiny_model}\n"  # 3
        "data:\n"  # 4
        f"  train_path: {task_files['sft_train']}\n"  # 5
        "train:\n"  # 6
        "  max_steps: 2\n"  # 7
        "  micro_batch_sise: 4\n"  # 8: the typo
    )
    done = run_trainer("sft", "--config", str(path))
    assert done.returncode == 2, done.stderr
    assert f"{path}:8" in done.stderr and "train.micro_batch_sise" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "out").exists()


def test_bad_data_row_names_file_line_and_writes_nothing(tmp_path, sft_config):
    data = tmp_path / "train.jsonl"
    data.write_text(
        '{"prompt": "1+1=", "completion": "2"}\n'
        '{"prompt": "1+2=", "completion": "3"}\n'
        '{"prompt": "1+3="}\n'  # line 3: no completion
        '{"prompt": "1+4=", "completion": "5"}\n'
    )
    sft_config["data"]["train_path"] = str(data)
    done = run_trainer("sft", "--config", str(write_config(tmp_path / "run.yaml", sft_config)))
    assert done.returncode == 2, done.stderr
    assert f"{data}:3" in done.stderr and "DataError" in done.stderr
    assert "Traceback" not in done.stderr
    assert not Path(sft_config["output_dir"]).exists()


def test_invalid_override_names_the_set_flag(tmp_path, sft_config):
    config = write_config(tmp_path / "run.yaml", sft_config)
    done = run_trainer("sft", "--config", str(config), "--set", "train.micro_batch_size=0")
    assert done.returncode == 2, done.stderr
    assert "--set train.micro_batch_size" in done.stderr
    assert not Path(sft_config["output_dir"]).exists()


def test_help_config_lists_stage_fields():
    done = run_trainer("dpo", "--help-config")
    assert done.returncode == 0, done.stderr
    assert any(line.startswith("dpo.beta ") for line in done.stdout.splitlines())


def test_missing_config_flag_exits_2():
    done = run_trainer("sft")
    assert done.returncode == 2
    assert "--config" in done.stderr


# -- runs ------------------------------------------------------------------------------------------


def test_run_exports_model_metrics_checkpoint_and_resolved_config(tmp_path, sft_config):
    config = write_config(tmp_path / "run.yaml", sft_config)
    done = run_trainer("sft", "--config", str(config), "--set", "train.max_steps=3")
    assert done.returncode == 0, done.stderr[-3000:]

    output = Path(sft_config["output_dir"])
    assert (output / "model" / "config.json").is_file()
    assert json.loads((output / "final_metrics.json").read_text())["global_step"] == 3
    assert (output / "checkpoints" / "latest").read_text().strip() == "step-00000003"
    resolved = load_config("sft", output / "config.yaml")
    assert resolved.train.max_steps == 3  # the override is part of the record
    assert resolved.model.path == sft_config["model"]["path"]


def test_stopped_run_resumes_to_max_steps(tmp_path, sft_config):
    config = str(write_config(tmp_path / "run.yaml", sft_config))
    output = Path(sft_config["output_dir"])

    stopped = run_trainer("sft", "--config", config, "--stop-after-steps", "2")
    assert stopped.returncode == 0, stopped.stderr[-3000:]
    assert not (output / "final_metrics.json").exists()  # stopped before the export
    assert (output / "checkpoints" / "latest").read_text().strip() == "step-00000002"

    resumed = run_trainer("sft", "--config", config)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stderr
    assert json.loads((output / "final_metrics.json").read_text())["global_step"] == sft_config["train"]["max_steps"]
