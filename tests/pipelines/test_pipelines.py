"""The pipelines compile to packages KFP loads back, and run end to end with kfp.local on the tiny task.

rlhf-dpo shows the registration gate closed (DPO does not beat SFT on greedy accuracy here) and
rlhf-grpo shows it open; rlhf-ppo (about a minute) is marked slow and runs in `make demo`.
"""

from __future__ import annotations

import json

import pytest

from pipelines.local_run import run_locally, task_outputs


@pytest.mark.parametrize(("name", "stage_parameter"), [("rlhf-dpo", "dpo_beta"), ("rlhf-ppo", "ppo_kl_coef"),
                                                      ("rlhf-grpo", "grpo_generations")])
def test_compiled_package_loads_back_with_its_parameters(name, stage_parameter, tmp_path):
    from kfp import compiler, components

    from pipelines.catalog import get_pipeline

    package = tmp_path / f"{name}.yaml"
    compiler.Compiler().compile(get_pipeline(name), str(package))
    loaded = components.load_component_from_file(str(package))
    assert loaded.name == name
    inputs = loaded.component_spec.inputs
    assert inputs["launcher_mode"].default == "kubernetes"
    assert inputs[stage_parameter].default is not None
    assert inputs["base_model_uri"].default is None  # a real model is an input, not a demo default
    assert inputs["max_new_tokens"].default == 256 and inputs["sft_lr"].default == 2e-5
    text = package.read_text()
    assert "tiny" not in text  # the tiny task is only a preset (alignflow run --preset tiny)
    assert "beats-baseline" in text  # the registration gate
    assert "retryPolicy" in text  # stages retry (and resume from their checkpoint)
    assert "exit-handler" in text and "cleanup-jobs" in text  # jobs are deleted however the run ends


@pytest.fixture(scope="module")
def local_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("pipeline-root")
    run_dir = run_locally("rlhf-dpo", root, {"sft_epochs": 5, "dpo_epochs": 1}, preset="tiny")
    return root, run_dir


def test_pipeline_runs_every_stage_and_writes_models(local_run):
    from transformers import AutoModelForCausalLM

    _, run_dir = local_run
    summary = task_outputs(run_dir, started=0.0)
    assert list(summary) == ["fingerprint-inputs", "prepare-inputs", "train-sft", "train-dpo", "evaluate-model",
                             "cleanup-jobs"]
    assert summary["train-sft"]["metrics"]["eval_loss"] > 0
    assert 0 <= summary["train-dpo"]["metrics"]["eval_rewards_accuracies"] <= 1
    AutoModelForCausalLM.from_pretrained(summary["train-dpo"]["model"])


def test_stage_report_shows_metrics_curves_config_and_the_mlflow_run(local_run):
    _, run_dir = local_run
    report = (run_dir / "train-dpo" / "report").read_text()
    assert "| eval/rewards/accuracies |" in report
    assert "- `loss`" in report  # a curve
    assert "MLflow run: `" in report and "mlflow.db" in report
    assert "beta: 0.1" in report  # the resolved config


def test_gate_skips_registration_when_dpo_does_not_beat_sft(local_run):
    _, run_dir = local_run
    output = json.loads((run_dir / "evaluate-model" / "executor_output.json").read_text())
    assert output["parameterValues"]["Output"] <= 0.0  # on the tiny task DPO does not beat SFT
    assert not (run_dir / "register-model").exists()


def test_stages_are_tracked_in_mlflow(local_run):
    from mlflow import MlflowClient

    root, _ = local_run
    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("alignflow").experiment_id])
    assert sorted(r.data.tags["mlflow.runName"] for r in runs) == ["dpo", "sft"]
    assert all(r.data.tags.get("alignflow.pipeline_run_id") for r in runs)


@pytest.mark.parametrize("name", ["rlhf-grpo", pytest.param("rlhf-ppo", marks=pytest.mark.slow)])
def test_online_pipeline_runs_end_to_end(name, tmp_path):
    run_dir = run_locally(name, tmp_path, {"sft_epochs": 20}, preset="tiny")
    summary = task_outputs(run_dir, started=0.0)
    evaluation = summary["evaluate-model"]["metrics"]
    assert evaluation["baseline_reward"] > 0.5  # SFT learned the format and most sums
    if name == "rlhf-grpo":
        # GRPO on the checker raises greedy accuracy, so the gate opens and the model is registered.
        assert evaluation["improvement"] > 0 and "register-model" in summary
        report = (run_dir / "train-grpo" / "report").read_text()
        samples = report.split("## Sample generations")[1].split("\n## ")[0]
        rows = [line for line in samples.splitlines() if line.startswith("| ") and "=" in line]
        assert len(rows) == 5  # prompt, response and score of five rollouts
    else:
        # PPO against the tiny reward model raises that model's score but not the checker's: the
        # gate stays closed (reward hacking, caught).
        stage = summary["train-ppo"]["metrics"]
        assert stage["eval_reward"] > stage["eval_reward_before"]
        assert "register-model" not in summary or evaluation["improvement"] > 0


def test_register_component_adds_a_registry_version(tmp_path, monkeypatch, tiny_model):
    from kfp import dsl
    from mlflow import MlflowClient

    from components.register.component import register_model

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    version = register_model.python_func(model=dsl.Model(uri=str(tiny_model)), name="tiny")
    assert version == "1"
    assert [str(v.version) for v in MlflowClient(uri).search_model_versions("name = 'tiny'")] == ["1"]
