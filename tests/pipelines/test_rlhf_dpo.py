"""The rlhf-dpo pipeline: it compiles to a package KFP loads back, and runs end to end with kfp.local."""

from __future__ import annotations

import json

import pytest

from pipelines.local_run import run_locally, task_outputs


def test_compiled_package_loads_back_with_its_parameters(tmp_path):
    from kfp import compiler, components

    from pipelines.rlhf_dpo import rlhf_dpo

    package = tmp_path / "rlhf-dpo.yaml"
    compiler.Compiler().compile(rlhf_dpo, str(package))
    loaded = components.load_component_from_file(str(package))
    assert loaded.name == "rlhf-dpo"
    inputs = loaded.component_spec.inputs
    assert inputs["launcher_mode"].default == "kubernetes"
    assert inputs["dpo_beta"].default == 0.1
    text = package.read_text()
    assert "dpo-beats-sft" in text  # the registration gate
    assert "retryPolicy" in text  # stages retry (and resume from their checkpoint)


@pytest.fixture(scope="module")
def local_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("pipeline-root")
    run_dir = run_locally("rlhf-dpo", root, {"sft_epochs": 5, "dpo_epochs": 1})
    return root, run_dir


def test_pipeline_runs_every_stage_and_writes_models(local_run):
    from transformers import AutoModelForCausalLM

    _, run_dir = local_run
    summary = task_outputs(run_dir, started=0.0)
    assert list(summary) == ["prepare-inputs", "train-sft", "train-dpo", "evaluate-model"]
    assert summary["train-sft"]["metrics"]["eval_loss"] > 0
    assert 0 <= summary["train-dpo"]["metrics"]["eval_rewards_accuracies"] <= 1
    AutoModelForCausalLM.from_pretrained(summary["train-dpo"]["model"])


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


def test_register_component_adds_a_registry_version(tmp_path, monkeypatch, tiny_model):
    from kfp import dsl
    from mlflow import MlflowClient

    from components.register.component import register_model

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    version = register_model.python_func(model=dsl.Model(uri=str(tiny_model)), name="tiny")
    assert version == "1"
    assert [str(v.version) for v in MlflowClient(uri).search_model_versions("name = 'tiny'")] == ["1"]
