"""The pipelines compile to packages KFP loads back, and run end to end with kfp.local on the tiny task.

On the `tiny` preset every pipeline's candidate beats its SFT baseline on the held-out prompts, so
the registration gate opens (rlhf-dpo here; rlhf-grpo and rlhf-ppo, a minute or more each, are
marked slow and run in `make demo`; so are rlhf-kto and rlhf-orpo); `tiny-reward-hacking` shows PPO over-optimising its reward
model and the gate staying closed (slow).
"""

from __future__ import annotations

import json

import pytest

from pipelines.local_run import run_locally, task_outputs

# Each pipeline's own stages, between SFT and the evaluation; the frame around them is the same for all.
OWN_STAGES = {"rlhf-dpo": ["train-dpo"], "rlhf-ppo": ["train-ppo", "train-reward-model"], "rlhf-grpo": ["train-grpo"],
              "rlhf-kto": ["train-kto"], "rlhf-orpo": ["train-orpo"]}


@pytest.mark.parametrize(("name", "stage_parameter"), [("rlhf-dpo", "dpo_beta"), ("rlhf-ppo", "ppo_kl_coef"),
                                                      ("rlhf-grpo", "grpo_generations"), ("rlhf-kto", "kto_beta"),
                                                      ("rlhf-orpo", "orpo_beta")])
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
    # The Kubeflow UI's run form shows each parameter's description from the IR: every one has one, and a
    # stage's hyper-parameter says what its component's input says (pipelines/parameters.py).
    import yaml

    spec = next(yaml.safe_load_all(text))
    # One frame (pipelines/steps.py): lineage and the exit task outside, then the inputs, SFT, the pipeline's own
    # stages, the evaluation and the gate inside the exit handler.
    assert sorted(spec["root"]["dag"]["tasks"]) == ["exit-handler-1", "finish-run", "open-lineage"]
    assert sorted(spec["components"]["comp-exit-handler-1"]["dag"]["tasks"]) == sorted(
        ["condition-2", "evaluate-model", "fingerprint-inputs", "prepare-inputs", "train-sft", *OWN_STAGES[name]])
    assert list(spec["components"]["comp-condition-2"]["dag"]["tasks"]) == ["register-model"]
    described = spec["root"]["inputDefinitions"]["parameters"]
    assert set(described) == set(inputs)
    assert [name for name, spec in described.items() if not spec.get("description")] == []
    assert described["sft_lr"]["description"] == "SFT: Peak learning rate of AdamW."
    assert described["launcher_mode"]["description"].startswith("`kubernetes`: each stage runs as a training job")


@pytest.fixture(scope="module")
def local_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("pipeline-root")
    run_dir = run_locally("rlhf-dpo", root, {}, preset="tiny")
    return root, run_dir


def test_pipeline_runs_every_stage_and_writes_models(local_run):
    from transformers import AutoModelForCausalLM

    _, run_dir = local_run
    summary = task_outputs(run_dir, started=0.0)
    assert list(summary) == ["open-lineage", "fingerprint-inputs", "prepare-inputs", "train-sft", "train-dpo",
                             "evaluate-model", "register-model", "finish-run"]
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


def test_gate_registers_dpo_when_it_beats_sft(local_run):
    _, run_dir = local_run
    summary = task_outputs(run_dir, started=0.0)
    evaluation = summary["evaluate-model"]["metrics"]
    # DPO+NLL on the preference pairs raises greedy accuracy on the held-out sums (0.3 -> 0.8 here).
    assert 0 < evaluation["baseline_reward"] < evaluation["reward"]
    assert evaluation["improvement"] > 0 and "register-model" in summary


def mlflow_runs(root) -> tuple[object, dict[str, object]]:
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("alignflow").experiment_id])
    return client, {r.data.tags["mlflow.runName"].split(" ")[0]: r for r in runs}


def test_one_lineage_parent_run_with_nested_stage_runs_and_dataset_inputs(local_run):
    import hashlib

    root, run_dir = local_run
    client, runs = mlflow_runs(root)
    assert sorted(runs) == ["dpo", "evaluate", "rlhf-dpo", "sft"]
    parent = runs["rlhf-dpo"]
    kfp_run_id = parent.data.tags["alignflow.pipeline_run_id"]
    from kfp import dsl

    assert kfp_run_id and kfp_run_id != dsl.PIPELINE_JOB_ID_PLACEHOLDER  # resolved to the run's id
    assert parent.data.tags["alignflow.pipeline"] == "rlhf-dpo" and parent.data.tags["alignflow.pipeline_version"]
    assert parent.info.status == "FINISHED"  # closed by the exit handler
    for stage in ("sft", "dpo", "evaluate"):
        tags = runs[stage].data.tags
        assert tags["mlflow.parentRunId"] == parent.info.run_id and tags["alignflow.task"] == stage
        assert tags["alignflow.pipeline_run_id"] == kfp_run_id
        assert client.list_artifacts(runs[stage].info.run_id) == []  # no copy of the weights per stage
    tiny = root / "tiny-inputs" / "data"
    logged = {d.dataset.name: json.loads(d.dataset.profile)["sha256"] for d in parent.inputs.dataset_inputs}
    assert logged["sft_train"] == hashlib.sha256((tiny / "sft_train.jsonl").read_bytes()).hexdigest()
    assert {"sft_train", "preference_train", "eval_prompts"} <= set(logged)


def test_evaluation_metrics_are_in_mlflow_under_the_parent_run(local_run):
    """Logged by evaluate-model itself, so they are there whatever the gate decides."""
    root, run_dir = local_run
    _, runs = mlflow_runs(root)
    evaluation = task_outputs(run_dir, started=0.0)["evaluate-model"]["metrics"]
    logged = runs["evaluate"].data.metrics
    for key in ("reward", "baseline_reward", "improvement"):
        assert logged[key] == pytest.approx(evaluation[key])
        assert runs["rlhf-dpo"].data.metrics[f"evaluation/{key}"] == pytest.approx(evaluation[key])
    assert "champion_reward" not in logged  # the first run: no champion yet, the baseline is the bar


def test_every_stage_writes_an_html_plot_of_its_curves(local_run):
    _, run_dir = local_run
    for task in ("train-sft", "train-dpo"):
        page = (run_dir / task / "curves").read_text()
        assert "<img alt='curves' src='data:image/png;base64," in page and "Final metrics" in page


def test_gate_registers_the_pipelines_candidate_into_its_lineage(local_run):
    """The run's own gate (DPO beat SFT): the version is tagged with the KFP run id, holds the aliases,
    and links the stage run."""
    root, run_dir = local_run
    client, runs = mlflow_runs(root)
    kfp_run_id = runs["rlhf-dpo"].data.tags["alignflow.pipeline_run_id"]
    version = json.loads((run_dir / "register-model" / "executor_output.json").read_text())["parameterValues"]
    registered = client.get_model_version_by_alias("alignflow-dpo", "champion")
    assert str(registered.version) == version["Output"] == "1"
    assert client.get_model_version_by_alias("alignflow-dpo", "candidate").version == registered.version
    assert registered.tags["alignflow.pipeline_run_id"] == kfp_run_id
    assert registered.tags["alignflow.pipeline"] == "rlhf-dpo"
    evaluation = task_outputs(run_dir, started=0.0)["evaluate-model"]["metrics"]
    for key in ("reward", "baseline_reward", "improvement"):
        assert float(registered.tags[f"metric.{key}"]) == pytest.approx(evaluation[key])
    assert registered.run_id == runs["dpo"].info.run_id  # -> the stage run -> its parent, the pipeline's run
    assert registered.tags["alignflow.evaluation_run_id"] == runs["evaluate"].info.run_id
    assert runs["rlhf-dpo"].data.tags["alignflow.registered_model"] == "alignflow-dpo/1"
    assert "Sample answers, side by side" in (run_dir / "register-model" / "comparison").read_text()


@pytest.mark.slow
def test_a_later_run_scores_the_champion_live_beside_its_candidate(local_run, tmp_path):
    """A second rlhf-dpo run on a copy of the first run's registry: its evaluation scores champion version 1
    (the first run's model, read where the first run left it) on the same prompts, and the gate compares with
    that score (about a minute and a half more)."""
    import shutil

    from mlflow import MlflowClient

    root, first_dir = local_run
    shutil.copytree(root, tmp_path / "root", ignore=shutil.ignore_patterns("rlhf-*"))  # mlflow.db, tiny inputs
    first = task_outputs(first_dir, started=0.0)["evaluate-model"]["metrics"]
    run_dir = run_locally("rlhf-dpo", tmp_path / "root", {}, preset="tiny")
    summary = task_outputs(run_dir, started=0.0)
    evaluation = summary["evaluate-model"]["metrics"]
    assert evaluation["champion_version"] == 1
    # A fresh evaluation of version 1's files reproduces the score its own run gave it (greedy, same prompts).
    assert evaluation["champion_reward"] == pytest.approx(first["reward"])
    client = MlflowClient(f"sqlite:///{tmp_path / 'root' / 'mlflow.db'}")
    if "register-model" in summary:  # it beat the SFT baseline: version 2, champion only if it beat version 1
        second = client.get_model_version_by_alias("alignflow-dpo", "candidate")
        assert str(second.version) == "2"
        assert second.tags["alignflow.compared_with"] == "champion version 1 (scored in this evaluation)"
        beats = evaluation["reward"] > evaluation["champion_reward"]
        assert str(client.get_model_version_by_alias("alignflow-dpo", "champion").version) == ("2" if beats else "1")


@pytest.mark.slow  # 60-70 s each on 2 cores
@pytest.mark.parametrize("name", ["rlhf-grpo", "rlhf-ppo"])
def test_online_pipeline_runs_end_to_end(name, tmp_path):
    run_dir = run_locally(name, tmp_path, {}, preset="tiny")
    summary = task_outputs(run_dir, started=0.0)
    evaluation = summary["evaluate-model"]["metrics"]
    assert 0 < evaluation["baseline_reward"] < 1  # held-out sums: SFT gets some right, not all
    # GRPO on the checker and PPO on the reward model (held near SFT by its KL penalty) both raise greedy
    # accuracy on the held-out sums, so the gate opens and leaves a tagged champion version.
    assert evaluation["improvement"] > 0 and "register-model" in summary
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
        stage = summary["train-ppo"]["metrics"]  # the reward model's score on the held-out prompts rose too
        assert stage["eval_reward"] > stage["eval_reward_before"]
        assert evaluation["rm_score"] > evaluation["baseline_rm_score"]


@pytest.mark.slow  # about 3-4 minutes each on 2 busy cores
@pytest.mark.parametrize("name", ["rlhf-kto", "rlhf-orpo"])
def test_kto_and_orpo_pipelines_beat_sft_and_register(name, tmp_path):
    run_dir = run_locally(name, tmp_path, {}, preset="tiny")
    summary = task_outputs(run_dir, started=0.0)
    evaluation = summary["evaluate-model"]["metrics"]
    assert evaluation["improvement"] > 0 and "register-model" in summary
    stage = name.split("-")[1]
    assert summary[f"train-{stage}"]["metrics"]["eval_rewards_accuracies"] > 0.5


@pytest.mark.slow
def test_gate_catches_ppo_hacking_its_reward_model(tmp_path):
    """`tiny-reward-hacking`: PPO without its KL penalty raises the reward model's score and lowers the
    checker's, so the gate does not register it (about a minute, like rlhf-ppo on `tiny`)."""
    run_dir = run_locally("rlhf-ppo", tmp_path, {}, preset="tiny-reward-hacking")
    summary = task_outputs(run_dir, started=0.0)
    evaluation = summary["evaluate-model"]["metrics"]
    assert evaluation["rm_score"] > evaluation["baseline_rm_score"]  # what PPO optimised went up
    assert evaluation["reward"] < evaluation["baseline_reward"]  # what it was meant to stand for went down
    assert evaluation["improvement"] <= 0 and "register-model" not in summary
    _, runs = mlflow_runs(tmp_path)  # the closed gate's evaluation is in MLflow all the same
    assert runs["evaluate"].data.metrics["reward"] == pytest.approx(evaluation["reward"])
    assert runs["evaluate"].data.tags["mlflow.parentRunId"] == runs["rlhf-ppo"].info.run_id
