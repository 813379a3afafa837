"""The pipelines compile to packages KFP loads back, and run end to end with kfp.local on the tiny task.

Each pipeline runs once, through `alignflow run --preset tiny`, and several tests read that run: every
candidate is confidently better than its SFT baseline on the held-out prompts, so the registration
gate opens (as on every seed and numerics variant of benchmarks/tiny_preset.md); `tiny-reward-hacking`
shows PPO over-optimising its reward model and the gate's reward-hacking guard refusing it. No test
asserts a recorded accuracy: other CPUs round differently (docs/testing.md). The run's output is short (a line
per task start and end, and the summary) and each task's executor output is in its own log file.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from pipelines.cli import main
from pipelines.local_run import run_locally, task_outputs
from pipelines.task_logs import COLOUR

# Each pipeline's own stages, between SFT and the evaluation; the frame around them is the same for all.
OWN_STAGES = {"rlhf-dpo": ["train-dpo"], "rlhf-ppo": ["train-ppo", "train-reward-model"], "rlhf-grpo": ["train-grpo"],
              "rlhf-kto": ["train-kto"], "rlhf-orpo": ["train-orpo"], "rlhf-agent": ["train-grpo"]}


@pytest.mark.parametrize(("name", "stage_parameter"), [("rlhf-dpo", "dpo_beta"), ("rlhf-ppo", "ppo_kl_coef"),
                                                      ("rlhf-grpo", "grpo_generations"), ("rlhf-kto", "kto_beta"),
                                                      ("rlhf-orpo", "orpo_beta"), ("rlhf-agent", "grpo_episodes")])
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
    assert "gate-opens" in text  # the registration gate
    assert inputs["gate_confidence"].default == 0.95 and inputs["gate_min_effect"].default == 0.05
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
    gate = spec["components"]["comp-exit-handler-1"]["dag"]["tasks"]["condition-2"]
    registers = "inputs.parameter_values['pipelinechannel--evaluate-model-Output'] == 'register'"
    assert gate["triggerPolicy"]["condition"] == registers  # the registration gate: evaluate-model's decision
    assert sorted(spec["components"]["comp-exit-handler-1"]["dag"]["tasks"]) == sorted(
        ["condition-2", "evaluate-model", "fingerprint-inputs", "prepare-inputs", "train-sft", *OWN_STAGES[name]])
    assert list(spec["components"]["comp-condition-2"]["dag"]["tasks"]) == ["register-model"]
    described = spec["root"]["inputDefinitions"]["parameters"]
    assert set(described) == set(inputs)
    assert [name for name, spec in described.items() if not spec.get("description")] == []
    assert described["sft_lr"]["description"] == "SFT: Peak learning rate of AdamW."
    assert described["launcher_mode"]["description"].startswith("`kubernetes`: each stage runs as a training job")


class CliRun:
    """One `alignflow run` of a pipeline: its root, the run's folder, and what it printed."""

    def __init__(self, root: Path, name: str, preset: str, *extra: str) -> None:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            self.exit_code = main(["run", name, "--preset", preset, "--root", str(root), *extra])
        self.root, self.stdout, self.stderr = root, out.getvalue(), err.getvalue()
        runs = sorted(root.glob(f"{name}-*"))
        self.run_dir = runs[-1] if runs else None
        self.log_dir = next((root / "logs").iterdir(), None) if (root / "logs").is_dir() else None

    def summary(self) -> dict[str, dict]:
        return task_outputs(self.run_dir, started=0.0)


@pytest.fixture(scope="module")
def cli_runs(tmp_path_factory):
    """`get(preset, pipeline)`: that pipeline's one run on the preset, made when a test first asks for it."""
    runs: dict[tuple[str, str], CliRun] = {}

    def get(preset: str, name: str) -> CliRun:
        if (preset, name) not in runs:
            runs[preset, name] = CliRun(tmp_path_factory.mktemp(f"{preset}-{name}"), name, preset)
            assert runs[preset, name].exit_code == 0, runs[preset, name].stderr
        return runs[preset, name]

    return get


@pytest.fixture(scope="module")
def local_run(cli_runs):
    run = cli_runs("tiny", "rlhf-dpo")
    return run.root, run.run_dir


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


# What each run's gate decides: on every seed and numerics variant measured (6 seeds x 5 variants,
# benchmarks/tiny_preset.md) each tiny candidate is registered and the reward-hacking run is refused by its
# accuracy guard. The evaluation scores each of the 20 held-out prompts by the mean of 16 sampled answers
# (`TINY_EVALUATION`), so a gain shows as a confident one on 20 prompts.
GATE_OPENS = {
    ("tiny", "rlhf-dpo"): True,
    ("tiny", "rlhf-ppo"): True,
    ("tiny-reward-hacking", "rlhf-ppo"): False,
    ("tiny", "rlhf-grpo"): True,
    ("tiny", "rlhf-kto"): True,
    ("tiny", "rlhf-orpo"): True,
}
# The runs `make test` makes (each a whole pipeline through kfp.local, 41-82 s on 2 cores): every gate. A run made
# `slow` here leaves `make test` (docs/testing.md).
IN_SUITE = set(GATE_OPENS)


def runs(*cases: tuple[str, str]) -> list:
    """`cases` as pytest parameters, the ones outside `IN_SUITE` marked slow."""
    return [pytest.param(*case, marks=() if case in IN_SUITE else pytest.mark.slow) for case in cases]


def within(value: float, bounds: tuple[float, float]) -> bool:
    return bounds[0] - 1e-6 <= value <= bounds[1] + 1e-6


def per_prompt_scores(run: CliRun) -> list[dict]:
    """The evaluation job's record of every held-out prompt's scores per model (what the gate decided on)."""
    path = run.run_dir / "evaluate-model" / "job" / "per_prompt.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.learning
@pytest.mark.parametrize(("preset", "name"), runs(*GATE_OPENS))
def test_the_gate_decides_from_the_paired_scores_and_refuses_reward_hacking(preset, name, cli_runs):
    """The gate's decision, recomputed from the evaluation's per-prompt scores; the registry follows it. Where
    the decision holds on every seed and CPU (`GATE_OPENS`) it is asserted, and each candidate's least gain."""
    from trainer.online.paired_gate import compare_paired

    run = cli_runs(preset, name)
    summary = run.summary()
    evaluation = summary["evaluate-model"]["metrics"]
    opens = bool(evaluation["gate/opens"])
    if GATE_OPENS[preset, name] is not None:
        assert opens == GATE_OPENS[preset, name], evaluation
    assert ("register-model" in summary) == opens
    # The judged metric: the reward model's score where rlhf-ppo trained on one, else the checker's reward.
    judged = "rm_score" if name == "rlhf-ppo" else "reward"
    records = per_prompt_scores(run)
    comparison = compare_paired([r["candidate"][judged] for r in records], [r["baseline"][judged] for r in records],
                                confidence=0.95)
    assert evaluation["gate/n"] == len(records) and evaluation["gate/lower_bound"] == pytest.approx(
        comparison.lower_bound)
    accuracy = compare_paired([r["candidate"]["reward"] for r in records], [r["baseline"]["reward"] for r in records],
                              confidence=0.95)
    assert accuracy.method == "bootstrap"  # means of 16 samples a prompt, not one 0/1 verdict
    if name == "rlhf-ppo":  # the reward-hacking guard: the checker's reward may not fall
        assert evaluation["gate/guard/reward/holds"] == float(accuracy.lower_bound >= -0.05), evaluation
        if preset == "tiny-reward-hacking":
            assert evaluation["gate/guard/reward/holds"] == 0.0 and accuracy.losses > accuracy.wins, evaluation
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{run.root / 'mlflow.db'}")
    registered = f"alignflow-{name.split('-')[1]}"
    _, mlflow_runs_by_task = mlflow_runs(run.root)
    reason = mlflow_runs_by_task["evaluate"].data.tags["alignflow.gate.baseline"]
    if opens:  # a tagged champion version, with the gate's numbers and sentence
        assert reason.startswith(f"opens against the baseline: {judged} +"), reason
        champion = client.get_model_version_by_alias(registered, "champion")
        assert champion.tags["alignflow.pipeline_run_id"] and champion.tags["alignflow.gate.baseline"] == reason
        assert float(champion.tags["metric.gate/lower_bound"]) == pytest.approx(evaluation["gate/lower_bound"])
    else:  # nothing registered, and the closed gate's evaluation is in MLflow all the same
        assert reason.startswith("refused against the baseline"), reason
        assert client.search_model_versions(f"name='{registered}'") == []
        assert mlflow_runs_by_task["evaluate"].data.metrics["reward"] == pytest.approx(evaluation["reward"])
        assert mlflow_runs_by_task["evaluate"].data.tags["mlflow.parentRunId"] == mlflow_runs_by_task[name].info.run_id
    report = (run.run_dir / "evaluate-model" / "report").read_text()
    assert "## The gate" in report and f"| baseline | {judged} | {len(records)} |" in report
    assert "gate: " in run.stdout and ("opens" if opens else "refused") in run.stdout


@pytest.mark.learning
def test_ppo_raises_its_reward_models_score_on_the_stages_own_held_out_prompts(cli_runs):
    """The same, as the PPO stage itself measured it before and after training (greedy, its own held-out rows)."""
    stage = cli_runs("tiny", "rlhf-ppo").summary()["train-ppo"]["metrics"]
    assert stage["eval_reward"] > stage["eval_reward_before"]


@pytest.mark.learning
def test_agent_unlearns_invalid_tool_calls_and_is_judged_as_it_trained(cli_runs):
    """rlhf-agent on `tiny` (the tool-use task): SFT copies its teacher's invalid `36x48` calls; GRPO over
    multi-turn calculator episodes unlearns the habit, so more calls are valid and more products are right, by
    a gain the gate confirms on the 64 held-out products (it opened on every seed and CPU variant measured,
    benchmarks/tiny_preset.md) and the model is registered. The evaluation runs the episodes as the GRPO stage
    trained on them: its `environment` section, not the defaults."""
    import yaml

    from trainer.online.paired_gate import compare_paired

    run = cli_runs("tiny", "rlhf-agent")
    summary = run.summary()
    evaluation = summary["evaluate-model"]["metrics"]
    records = per_prompt_scores(run)
    accuracy = compare_paired([r["candidate"]["reward"] for r in records], [r["baseline"]["reward"] for r in records],
                              confidence=0.95)
    assert evaluation["gate/lower_bound"] == pytest.approx(accuracy.lower_bound) and evaluation["gate/n"] == 64
    assert evaluation["gate/opens"] == 1.0 and "register-model" in summary, evaluation
    assert accuracy.lower_bound > evaluation["gate/min_effect"] and accuracy.wins > 3 * accuracy.losses, accuracy
    assert evaluation["gate/guard/valid_tool_calls/holds"] == 1.0, evaluation
    assert evaluation["valid_tool_call_fraction"] > evaluation["baseline_valid_tool_call_fraction"], evaluation
    evaluated = yaml.safe_load((run.run_dir / "evaluate-model" / "job" / "evaluate.yaml").read_text())
    trained = yaml.safe_load((run.run_dir / "train-grpo" / "job" / "grpo.yaml").read_text())
    assert evaluated["environment"] == trained["environment"] and evaluated["environment"]["max_turns"] == 3
    metrics = [json.loads(line) for line in (run.run_dir / "train-grpo" / "job" / "metrics.jsonl").read_text()
               .splitlines()]
    validity = [line["agent/valid_tool_call_fraction"] for line in metrics if "agent/valid_tool_call_fraction" in line]
    # The sampled episodes' calls got more valid as GRPO trained (0.77 -> 0.98-1.0 at seed 42).
    assert sum(validity[-5:]) / 5 > validity[0] + 0.05, validity


def test_grpo_report_shows_sample_rollouts(cli_runs):
    report = (cli_runs("tiny", "rlhf-grpo").run_dir / "train-grpo" / "report").read_text()
    samples = report.split("## Sample generations")[1].split("\n## ")[0]
    rows = [line for line in samples.splitlines() if line.startswith("| ") and "=" in line]
    assert len(rows) == 5  # prompt, response and score of five rollouts


@pytest.mark.parametrize("name", ["rlhf-kto", "rlhf-orpo"])
def test_kto_and_orpo_prefer_the_desirable_answers_on_held_out_rows(name, cli_runs):
    stage = name.split("-")[1]
    metrics = cli_runs("tiny", name).summary()[f"train-{stage}"]["metrics"]
    assert metrics["eval_rewards_accuracies"] > 0.5


# `make demo` runs three pipelines and should print under about 100 lines in all.
MAX_LINES_PER_RUN = 33


@pytest.mark.parametrize(("preset", "name"), runs(*GATE_OPENS))
def test_a_run_prints_a_line_per_task_and_the_summary_and_files_each_tasks_log(preset, name, cli_runs):
    run = cli_runs(preset, name)
    printed = run.stdout.splitlines() + run.stderr.splitlines()
    assert len(printed) <= MAX_LINES_PER_RUN, "\n".join(printed)
    tasks = list(run.summary())
    for task in tasks:
        assert f"{task} started" in printed and any(line.startswith(f"{task} done in ") for line in printed)
        log = (run.log_dir / f"{task}.log").read_text()
        assert f"Executing task '{task}'" in log and "[KFP Executor" in log  # the executor's own output
    assert "[KFP Executor" not in run.stdout + run.stderr and "[master-0]" not in run.stdout + run.stderr
    # The training jobs' output is in their task's log, and their last step on the task's line.
    sft_log = (run.log_dir / "train-sft.log").read_text()
    assert "[master-0]" in sft_log and "trainer.supervised.loop: step 75/75" in sft_log
    assert any(line.startswith("train-sft done in ") and "(step 75/75 loss" in line for line in printed)
    assert run.stdout.splitlines()[0].split() == ["task", "time", "key", "metrics", "model"]
    assert run.stdout.splitlines()[-1] == f"executor logs: {run.log_dir}/<task>.log"


def test_verbose_streams_the_executor_output_and_a_failed_run_names_its_log(tmp_path):
    """A dataset that does not match its manifest hash stops the run at its first task (a few seconds)."""
    from pipelines.presets import write_tiny_inputs

    inputs = write_tiny_inputs(tmp_path)
    wrong = json.dumps({inputs["sft_train_uri"]: "0" * 64})
    run = CliRun(tmp_path, "rlhf-dpo", "tiny", "--verbose", "--param", f"dataset_sha256={wrong}")
    assert run.exit_code == 1  # the run did not succeed (not a usage error, not a traceback)
    log = run.log_dir / "open-lineage.log"
    streamed = COLOUR.sub("", run.stdout)  # as kfp.local prints it, in colour
    assert "[KFP Executor" in streamed and "Executing task 'open-lineage'" in streamed
    assert inputs["sft_train_uri"] in log.read_text()  # the error, in the task's log too
    assert f"LocalRunFailed: rlhf-dpo: task(s) failed: open-lineage ({log})" in run.stderr
