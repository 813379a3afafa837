"""What a run does with what its output_dir already holds: resume its own checkpoints (falling back
past a damaged one), refuse foreign ones and a changed world size, continue its metric history and
MLflow run, and neither retrain a finished run nor overwrite one unasked."""

from __future__ import annotations

import json
import logging
import os
import shutil

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import make_config
from trainer.errors import CheckpointError, ConfigError, RunFinished
from trainer.supervised.stages import run_stage
from trainer.tiny.model import write_tiny_model


def sft(output, tiny_model, task_files, **updates):
    return make_config("sft", output, tiny_model, task_files["sft_train"],
                       **{"train": {"max_epochs": 2, "micro_batch_size": 8, "log_interval": 1},
                          "checkpoint": {"save_interval": 3, "keep_last": 0}, **updates})


def weights(output) -> dict[str, torch.Tensor]:
    return load_file(output / "model" / "model.safetensors")


def records(output) -> list[dict]:
    return [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("damage", ["truncated", pytest.param("missing", marks=pytest.mark.slow)])
def test_damaged_latest_checkpoint_falls_back_to_the_previous_one_bit_exact(damage, tmp_path, tiny_model, task_files,
                                                                            caplog):
    caplog.set_level(logging.INFO, logger="trainer")
    run_stage(sft(tmp_path / "straight", tiny_model, task_files))
    output = tmp_path / "resumed"
    stopped = run_stage(sft(output, tiny_model, task_files), stop_after_steps=7)  # checkpoints at 3, 6 and 7
    # A stage stopped early says so, and why its metrics carry no evaluation.
    assert stopped.stopped.startswith("stopped after step 7 (--stop-after-steps)")
    assert not any(key.startswith("eval/") for key in stopped.metrics)
    damaged = output / "checkpoints" / "step-00000007" / "model.optimizer.pt"
    if damage == "truncated":
        damaged.write_bytes(damaged.read_bytes()[: damaged.stat().st_size // 2])
    else:
        damaged.unlink()

    run_stage(sft(output, tiny_model, task_files))
    assert f"checkpoint {output / 'checkpoints' / 'step-00000007'} is not usable" in caplog.text
    assert f"resumed from {output / 'checkpoints' / 'step-00000006'}" in caplog.text
    straight, resumed = weights(tmp_path / "straight"), weights(output)
    assert all(torch.equal(straight[k], resumed[k]) for k in straight)
    assert [r["step"] for r in records(output) if "loss" in r] == list(range(1, 21))  # steps 7.. once, again


def test_only_checkpoint_damaged_is_one_error_naming_the_file(tmp_path, tiny_model, task_files):
    output = tmp_path / "out"
    run_stage(sft(output, tiny_model, task_files, checkpoint={"save_interval": 0}), stop_after_steps=2)
    state = output / "checkpoints" / "step-00000002" / "trainer_state.json"
    state.write_text(state.read_text()[:5])  # truncated marker
    with pytest.raises(CheckpointError, match=rf"{state}: not valid JSON"):
        run_stage(sft(output, tiny_model, task_files))


def test_checkpoint_of_another_stage_is_refused(tmp_path, tiny_model, task_files):
    output = tmp_path / "out"
    run_stage(make_config("dpo", output, tiny_model, task_files["pref_eval"], train={"max_steps": 4}),
              stop_after_steps=2)
    with pytest.raises(CheckpointError, match=r"step-00000002 belongs to another run: stage is 'dpo' there, 'sft' "
                                              r"here \(and \d+ more\); use another output_dir"):
        run_stage(sft(output, tiny_model, task_files))
    assert not (output / "model").exists()


def test_changed_shaping_key_is_refused(tmp_path, tiny_model, task_files):
    output = tmp_path / "out"
    run_stage(sft(output, tiny_model, task_files), stop_after_steps=2)
    with pytest.raises(CheckpointError, match=r"train.micro_batch_size is 8 there, 4 here"):
        run_stage(sft(output, tiny_model, task_files, train={"max_epochs": 2, "micro_batch_size": 4}))
    run_stage(sft(output, tiny_model, task_files, optimizer={"lr": 1e-3}))  # a new learning rate resumes


def test_changed_world_size_is_refused(tmp_path, tiny_model, task_files):
    output = tmp_path / "out"
    run_stage(sft(output, tiny_model, task_files), stop_after_steps=2)
    manifest = output / "checkpoints" / "step-00000002" / "manifest.json"
    manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "world_size": 2}))
    with pytest.raises(CheckpointError, match=r"written by 2 data-parallel process\(es\), this run has 1"):
        run_stage(sft(output, tiny_model, task_files))


def test_checkpoint_that_does_not_fit_the_model_is_one_error(tmp_path, task_files):
    model = write_tiny_model(tmp_path / "model")
    output = tmp_path / "out"
    run_stage(sft(output, model, task_files), stop_after_steps=2)
    shutil.rmtree(model)
    write_tiny_model(model, hidden_size=32)  # same path, other shapes
    with pytest.raises(CheckpointError, match=r"does not fit the model being trained: size mismatch for"):
        run_stage(sft(output, model, task_files))


def test_rerunning_a_finished_run_says_so_and_trains_nothing(tmp_path, tiny_model, task_files):
    output = tmp_path / "out"
    run_stage(sft(output, tiny_model, task_files))
    before = (output / "model" / "model.safetensors").stat().st_mtime_ns
    with pytest.raises(RunFinished, match=rf"{output} already holds a finished sft run"):
        run_stage(sft(output, tiny_model, task_files))
    assert (output / "model" / "model.safetensors").stat().st_mtime_ns == before


def test_resume_false_refuses_a_used_output_dir_unless_told_to_overwrite(tmp_path, tiny_model, task_files):
    output = tmp_path / "out"
    run_stage(sft(output, tiny_model, task_files), stop_after_steps=4)
    with pytest.raises(ConfigError, match=r"already holds a run \(checkpoints, metrics.jsonl\) and "
                                          r"checkpoint.resume is false"):
        run_stage(sft(output, tiny_model, task_files, checkpoint={"resume": False}))
    run_stage(sft(output, tiny_model, task_files, checkpoint={"resume": False, "overwrite": True, "save_interval": 0}))
    assert sorted(p.name for p in (output / "checkpoints").iterdir()) == ["latest", "step-00000010", "step-00000020"]
    assert [r["step"] for r in records(output) if "loss" in r] == list(range(1, 21))


def test_final_metrics_are_complete_when_resumed_at_the_last_step(tmp_path, tiny_model, task_files):
    run_stage(sft(tmp_path / "straight", tiny_model, task_files))
    output = tmp_path / "resumed"
    run_stage(sft(output, tiny_model, task_files), stop_after_steps=20)  # killed after the last checkpoint
    run_stage(sft(output, tiny_model, task_files))
    straight = json.loads((tmp_path / "straight" / "final_metrics.json").read_text())
    resumed = json.loads((output / "final_metrics.json").read_text())
    assert resumed.keys() == straight.keys()
    assert resumed["loss"] == straight["loss"] and resumed["global_step"] == 20
    assert [r["step"] for r in records(output) if "loss" in r] == list(range(1, 21))


def test_resume_continues_the_mlflow_run(tmp_path, tiny_model, task_files, monkeypatch):
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    for name in ("MLFLOW_RUN_ID", "MLFLOW_EXPERIMENT_ID", "MLFLOW_EXPERIMENT_NAME"):
        monkeypatch.delenv(name, raising=False)
    output = tmp_path / "out"
    tracking = {"backend": "mlflow", "experiment_name": "resume", "log_model": False}
    run_stage(sft(output, tiny_model, task_files, tracking=tracking), stop_after_steps=5)
    first = json.loads((output / "mlflow_run.json").read_text())["run_id"]
    run_stage(sft(output, tiny_model, task_files, tracking=tracking))

    assert json.loads((output / "mlflow_run.json").read_text())["run_id"] == first
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("resume").experiment_id])
    assert [run.info.run_id for run in runs] == [first] and runs[0].info.status == "FINISHED"
    assert sorted(m.step for m in client.get_metric_history(first, "loss")) == list(range(1, 21))
    assert os.environ["MLFLOW_TRACKING_URI"] == uri
