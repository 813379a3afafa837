"""evaluate_model with the local launcher (a real `python -m trainer evaluate` job on the tiny task), a real
`mlflow server` and a moto S3 server: the registry's champion (its files on S3, as on a cluster) is scored
live beside the candidate and the baseline, the metrics reach MLflow under the pipeline's parent run
whatever the gate decides, and the gate compares live scores."""

from __future__ import annotations

import os
import shutil
import uuid

import pytest
from kfp import dsl

from components.evaluate.component import evaluate_model
from components.register.component import register_model
from components.register.registry import register_candidate
from tests.integration.services import S3_ENV, start_mlflow, start_moto, stop
from trainer.errors import PipelineError
from trainer.storage.s3 import S3Storage
from trainer.storage.transfer import upload_dir

REWARD = "trainer.tiny.task:reward"


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """(S3 endpoint, MLflow URI): MLflow refuses a local folder as a version's source, so models go to S3."""
    root = tmp_path_factory.mktemp("servers")
    moto, endpoint = start_moto(root)
    mlflow, uri = start_mlflow(root, str(root / "artifacts"), {})
    yield endpoint, uri
    stop(mlflow)
    stop(moto)


@pytest.fixture
def tracking(servers, monkeypatch, tmp_path):
    from mlflow import MlflowClient

    endpoint, uri = servers
    # The evaluation job (a child process) inherits these: it downloads the champion from the moto bucket.
    for key, value in {**S3_ENV, "AWS_ENDPOINT_URL": endpoint, "MLFLOW_S3_ENDPOINT_URL": endpoint,
                       "MLFLOW_TRACKING_URI": uri, "ALIGNFLOW_CACHE_DIR": str(tmp_path / "cache")}.items():
        monkeypatch.setenv(key, value)
    for name in ("MLFLOW_EXPERIMENT_ID", "MLFLOW_EXPERIMENT_NAME", "ALIGNFLOW_MLFLOW_EXTERNAL_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(S3Storage, "_shared", None)  # a client made earlier points elsewhere
    return MlflowClient(uri)


def s3_model(local_dir) -> str:
    """The model's files in a fresh moto bucket, as a pipeline on a cluster leaves its exported model."""
    import boto3

    bucket = f"models-{uuid.uuid4().hex[:8]}"
    boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"]).create_bucket(Bucket=bucket)
    uri = f"s3://{bucket}/run-1/train-dpo/model"
    upload_dir(local_dir, uri)
    return uri


def parent_run(client, kfp_run_id: str) -> str:
    """A pipeline parent run as open_lineage leaves it."""
    experiment = client.get_experiment_by_name("alignflow") or client.get_experiment(
        client.create_experiment("alignflow"))
    return client.create_run(experiment.experiment_id, tags={"alignflow.kind": "pipeline",
                                                             "alignflow.pipeline_run_id": kfp_run_id}).info.run_id


def copy_model(source, target):
    shutil.copytree(source, target)
    return target


def evaluate(run_dir, kfp_run_id: str, candidate, baseline, prompts, *, name: str = "", parent: str = "", **gate):
    """Run the component's function as kfp.local would: outputs beside each other under the run's folder."""
    metrics = dsl.Metrics(uri=str(run_dir / "evaluate-model" / "metrics"))
    report = dsl.Markdown(uri=str(run_dir / "evaluate-model" / "report"))
    (run_dir / "evaluate-model").mkdir(parents=True)
    decision = evaluate_model.python_func(
        model=dsl.Model(uri=str(candidate), metadata={"stage": "dpo"}), baseline=dsl.Model(uri=str(baseline)),
        prompts=dsl.Dataset(uri=str(prompts)), metrics=metrics, report=report, run_id=kfp_run_id,
        reward_function=REWARD, max_new_tokens=4, launcher_mode="local", gpus_per_node=0,
        registered_model_name=name, parent_run_id=parent, **gate)
    return decision, metrics, open(report.path).read()


def some_prompts(task_files, tmp_path, count: int = 10):
    """The first held-out prompts (fewer generations: three models are scored)."""
    lines = task_files["eval_prompts"].read_text().splitlines(keepends=True)[:count]
    (tmp_path / "prompts.jsonl").write_text("".join(lines))
    return tmp_path / "prompts.jsonl"


def nested_evaluate_run(client, parent: str):
    [run] = client.search_runs([client.get_experiment_by_name("alignflow").experiment_id],
                               f"tags.`mlflow.parentRunId` = '{parent}' and tags.`alignflow.task` = 'evaluate'")
    return run


def test_the_champion_is_scored_live_and_the_gate_follows_that_score(tmp_path, tracking, tiny_model, sft_model,
                                                                   task_files):
    name = "alignflow-live-champion"
    # Version 1, the champion: the untrained model, registered with a recorded score no candidate could beat.
    champion_uri = s3_model(tiny_model)
    register_candidate(model_uri=champion_uri, name=name, scores={"reward": 0.99, "baseline_reward": 0.0})
    parent = parent_run(tracking, "kfp-2")
    run_dir = tmp_path / "run-2"
    candidate = s3_model(sft_model)  # the candidate's files on S3 too: MLflow registers no local folder
    # All 20 held-out prompts, and a lenient gate (60% confidence, no minimum effect): SFT answers about a third of
    # them right and the untrained model none, so the gate opens on both; this test is about whose scores it reads.
    decision, metrics, report = evaluate(run_dir, "kfp-2", candidate, tiny_model,
                                         some_prompts(task_files, tmp_path, count=20), name=name, parent=parent,
                                         gate_confidence=0.6, gate_min_effect=0.0)
    scores = metrics.metadata
    assert scores["champion_version"] == 1.0
    # A fresh score of the champion's files in this job (the same files as the baseline: the same score), not
    # the 0.99 recorded at its registration.
    assert scores["champion_reward"] == scores["baseline_reward"] < scores["reward"]
    assert decision == "register" and scores["gate/opens"] == scores["champion_gate/opens"] == 1.0
    assert scores["gate/confidence"] == 0.6 and scores["gate/difference"] == pytest.approx(scores["improvement"])
    assert "champion (version 1)" in report and "| champion | score |" in report
    assert "| baseline | reward | 20 |" in report and "| champion | reward | 20 |" in report
    # The gate registers version 2 and, on the live score, makes it the champion (the recorded 0.99 would not).
    comparison = dsl.HTML(uri=str(run_dir / "register-model" / "comparison"))
    (run_dir / "register-model").mkdir()
    version = register_model.python_func(model=dsl.Model(uri=str(candidate), metadata={"stage": "dpo"}),
                                         evaluation=metrics, comparison=comparison, name=name,
                                         parent_run_id=parent, run_id="kfp-2", pipeline="rlhf-dpo")
    assert version == "2" and tracking.get_model_version_by_alias(name, "champion").version == "2"
    page = open(comparison.path).read()
    assert f"<td>{scores['champion_reward']:.4g}</td>" in page and "0.99" not in page
    assert "was scored by this run's evaluation" in page
    version_tags = tracking.get_model_version(name, "2").tags
    assert version_tags["alignflow.gate.champion"].startswith("opens against the champion: reward +")
    assert float(version_tags["metric.gate/lower_bound"]) == pytest.approx(scores["gate/lower_bound"])
    evaluation_run = nested_evaluate_run(tracking, parent)
    assert tracking.get_model_version(name, "2").tags["alignflow.evaluation_run_id"] == evaluation_run.info.run_id
    assert evaluation_run.data.params["champion_version"] == "1"
    assert evaluation_run.data.params["champion_uri"] == champion_uri


def test_metrics_reach_mlflow_under_the_parent_run_when_the_gate_stays_closed(tmp_path, tracking, tiny_model,
                                                                            task_files):
    parent = parent_run(tracking, "kfp-closed")
    run_dir = tmp_path / "run"
    # A candidate no better than its baseline (the same model): every prompt a tie, so the gate stays closed.
    decision, metrics, report = evaluate(run_dir, "kfp-closed", copy_model(tiny_model, run_dir / "train" / "model"),
                                         tiny_model, some_prompts(task_files, tmp_path),
                                         name="alignflow-no-champion-yet", parent=parent)
    assert decision == "refuse" and "champion_version" not in metrics.metadata  # no champion: baseline only
    assert metrics.metadata["gate/lower_bound"] == metrics.metadata["gate/difference"] == 0.0
    assert "- baseline: refused against the baseline: reward +0.000" in report
    run = nested_evaluate_run(tracking, parent)
    assert run.data.tags["alignflow.task"] == "evaluate" and run.data.tags["alignflow.pipeline_run_id"] == "kfp-closed"
    assert run.info.status == "FINISHED"
    assert run.data.metrics == {key: pytest.approx(value) for key, value in metrics.metadata.items()}
    assert {"reward", "baseline_reward", "improvement"} <= set(run.data.metrics)
    lineage = tracking.get_run(parent)
    assert lineage.data.metrics["evaluation/gate/opens"] == 0.0
    assert lineage.data.tags["alignflow.gate.baseline"] == run.data.tags["alignflow.gate.baseline"]
    assert lineage.data.tags["alignflow.gate.baseline"].startswith("refused against the baseline: reward")


def test_a_champion_whose_files_are_gone_stops_the_evaluation_with_its_version_and_source(tmp_path, tracking,
                                                                                       tiny_model, task_files):
    name = "alignflow-lost-champion"
    champion_uri = s3_model(tiny_model)
    register_candidate(model_uri=champion_uri, name=name, scores={"reward": 0.5})
    storage = S3Storage.shared()
    for uri in storage.list(champion_uri):
        storage.delete(uri)
    with pytest.raises(PipelineError, match=f"{name} version 1 \\(alias champion\\): no model at its source "
                                            f"{champion_uri} "):
        evaluate(tmp_path / "run", "kfp-lost", tiny_model, tiny_model, task_files["eval_prompts"], name=name)


def test_an_agent_is_evaluated_with_the_turns_tools_and_stop_tokens_its_stage_trained_with():
    """The GRPO stage leaves its resolved `environment` section and stop tokens in its Model's metadata
    (components/stage_io.py); the evaluation's episodes run with them, not the defaults."""
    from components.evaluate.job import evaluation_config

    trained = {"stage": "grpo", "generation_stop": ["<|end|>"],
               "environment": {"name": "tiny_calculator", "max_turns": 3, "max_total_tokens": 200,
                               "tools": ["calculator"]}}
    params = {"model": dsl.Model(uri="/m", metadata=trained), "baseline": dsl.Model(uri="/b"),
              "prompts": dsl.Dataset(uri="/p"), "reward_function": "tiny_calculator", "max_new_tokens": 80,
              "environment": "tiny_calculator"}
    config = evaluation_config(params)
    assert config["environment"] == trained["environment"]
    assert config["generation"] == {"max_new_tokens": 80, "temperature": 0.0, "stop": ["<|end|>"]}
    # Without an environment the stage's section is not used: one answer per prompt.
    assert evaluation_config({**params, "environment": ""})["environment"] is None


def test_the_evaluation_samples_as_the_pipeline_asks():
    from components.evaluate.job import evaluation_config

    params = {"model": dsl.Model(uri="/m"), "baseline": dsl.Model(uri="/b"), "prompts": dsl.Dataset(uri="/p"),
              "reward_function": "tiny_addition", "max_new_tokens": 4, "samples_per_prompt": 16, "temperature": 0.3}
    config = evaluation_config(params)
    assert config["samples_per_prompt"] == 16 and config["generation"] == {"max_new_tokens": 4, "temperature": 0.3}
    greedy = evaluation_config({key: value for key, value in params.items() if key not in ("samples_per_prompt",
                                                                                           "temperature")})
    assert greedy["samples_per_prompt"] == 1 and greedy["generation"]["temperature"] == 0.0
