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
    assert "exit-handler" in text and "finish-run" in text  # jobs deleted, MLflow run closed, however it ends
    assert "open-lineage" in text and "parent_run_id" in text  # the MLflow parent run, passed to the stages


@pytest.fixture(scope="module")
def local_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("pipeline-root")
    run_dir = run_locally("rlhf-dpo", root, {"sft_epochs": 5, "dpo_epochs": 1}, preset="tiny")
    return root, run_dir


def test_pipeline_runs_every_stage_and_writes_models(local_run):
    from transformers import AutoModelForCausalLM

    _, run_dir = local_run
    summary = task_outputs(run_dir, started=0.0)
    assert list(summary) == ["open-lineage", "fingerprint-inputs", "prepare-inputs", "train-sft", "train-dpo",
                             "evaluate-model", "finish-run"]
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


def mlflow_runs(root) -> tuple[object, dict[str, object]]:
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("alignflow").experiment_id])
    return client, {r.data.tags["mlflow.runName"].split(" ")[0]: r for r in runs}


def test_one_lineage_parent_run_with_nested_stage_runs_and_dataset_inputs(local_run):
    import hashlib

    root, run_dir = local_run
    client, runs = mlflow_runs(root)
    assert sorted(runs) == ["dpo", "rlhf-dpo", "sft"]
    parent = runs["rlhf-dpo"]
    kfp_run_id = parent.data.tags["alignflow.pipeline_run_id"]
    assert parent.data.tags["alignflow.pipeline"] == "rlhf-dpo" and parent.data.tags["alignflow.pipeline_version"]
    assert parent.info.status == "FINISHED"  # closed by the exit handler
    for stage in ("sft", "dpo"):
        tags = runs[stage].data.tags
        assert tags["mlflow.parentRunId"] == parent.info.run_id and tags["alignflow.task"] == stage
        assert tags["alignflow.pipeline_run_id"] == kfp_run_id
        assert client.list_artifacts(runs[stage].info.run_id) == []  # no copy of the weights per stage
    tiny = root / "tiny-inputs" / "data"
    logged = {d.dataset.name: json.loads(d.dataset.profile)["sha256"] for d in parent.inputs.dataset_inputs}
    assert logged["sft_train"] == hashlib.sha256((tiny / "sft_train.jsonl").read_bytes()).hexdigest()
    assert {"sft_train", "preference_train", "eval_prompts"} <= set(logged)


def test_every_stage_writes_an_html_plot_of_its_curves(local_run):
    _, run_dir = local_run
    for task in ("train-sft", "train-dpo"):
        page = (run_dir / task / "curves").read_text()
        assert "<img alt='curves' src='data:image/png;base64," in page and "Final metrics" in page


def test_gate_registers_the_pipelines_candidate_into_its_lineage(local_run, monkeypatch):
    """The registration gate on this run's DPO model (the tiny DPO does not beat SFT, so the run's own gate
    stayed closed): the version is tagged with the KFP run id, holds the aliases, and links the stage run."""
    from kfp import dsl

    from components.register.component import register_model

    root, run_dir = local_run
    client, runs = mlflow_runs(root)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{root / 'mlflow.db'}")
    kfp_run_id = runs["rlhf-dpo"].data.tags["alignflow.pipeline_run_id"]
    evaluation = json.loads((run_dir / "evaluate-model" / "executor_output.json").read_text())
    [metrics] = evaluation["artifacts"]["metrics"]["artifacts"]
    (run_dir / "gate").mkdir()
    version = register_model.python_func(
        model=dsl.Model(uri=str(run_dir / "train-dpo" / "model"), metadata={"stage": "dpo"}),
        evaluation=dsl.Metrics(uri=metrics["uri"], metadata=metrics["metadata"]),
        comparison=dsl.HTML(uri=str(run_dir / "gate" / "comparison")), name="alignflow-dpo",
        parent_run_id=runs["rlhf-dpo"].info.run_id, run_id=kfp_run_id, pipeline="rlhf-dpo")
    registered = client.get_model_version_by_alias("alignflow-dpo", "champion")
    assert str(registered.version) == version == "1"
    assert client.get_model_version_by_alias("alignflow-dpo", "candidate").version == registered.version
    assert registered.tags["alignflow.pipeline_run_id"] == kfp_run_id
    assert registered.run_id == runs["dpo"].info.run_id  # -> the stage run -> its parent, the pipeline's run
    assert "Sample answers, side by side" in (run_dir / "gate" / "comparison").read_text()


@pytest.mark.parametrize("name", ["rlhf-grpo", pytest.param("rlhf-ppo", marks=pytest.mark.slow)])
def test_online_pipeline_runs_end_to_end(name, tmp_path):
    run_dir = run_locally(name, tmp_path, {"sft_epochs": 20}, preset="tiny")
    summary = task_outputs(run_dir, started=0.0)
    evaluation = summary["evaluate-model"]["metrics"]
    assert 0 < evaluation["baseline_reward"] < 1  # held-out sums: SFT gets some right, not all
    # The gate opens exactly when the candidate beats SFT; an opened gate leaves a tagged champion version.
    assert ("register-model" in summary) == (evaluation["improvement"] > 0)
    if "register-model" in summary:
        from mlflow import MlflowClient

        registered = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}").get_model_version_by_alias(
            f"alignflow-{name.split('-')[1]}", "champion")
        assert registered.tags["alignflow.pipeline_run_id"] and float(registered.tags["metric.improvement"]) > 0
    if name == "rlhf-grpo":
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
