"""The registration gate against a real MLflow store (sqlite) and a real exported tiny model: one version
per candidate, tagged back to its pipeline run, aliases `candidate` and `champion`, the model loadable
through MLflow from where it lies, and the side-by-side report."""

from __future__ import annotations

import json
import shutil

import pytest
from kfp import dsl

from components.register.component import register_model
from components.register.mlflow_model import registry_source

NAME = "alignflow-grpo"


@pytest.fixture
def tracking(tmp_path, monkeypatch):
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.delenv("ALIGNFLOW_MLFLOW_EXTERNAL_URL", raising=False)
    for name in ("MLFLOW_EXPERIMENT_ID", "MLFLOW_EXPERIMENT_NAME"):
        monkeypatch.delenv(name, raising=False)
    return MlflowClient(uri)


def pipeline_run(client, kfp_run_id: str) -> tuple[str, str]:
    """A parent run as open_lineage leaves it, and a grpo stage run nested under it as the trainer does."""
    experiment = client.get_experiment_by_name("alignflow") or client.get_experiment(
        client.create_experiment("alignflow"))
    parent = client.create_run(experiment.experiment_id, tags={"alignflow.kind": "pipeline",
                                                               "alignflow.pipeline_run_id": kfp_run_id}).info.run_id
    stage = client.create_run(experiment.experiment_id, tags={"mlflow.parentRunId": parent, "alignflow.task": "grpo",
                                                              "alignflow.pipeline_run_id": kfp_run_id}).info.run_id
    return parent, stage


def gate(tmp_path, tiny_model, client, kfp_run_id: str, reward: float, samples: list[dict] | None = None,
         **champion: float):
    """Run the component's function as KFP would: the candidate's Model, the evaluation's Metrics (with
    `champion_version`/`champion_reward` when the evaluation scored the champion)."""
    parent, stage = pipeline_run(client, kfp_run_id)
    run_dir = tmp_path / f"local-{kfp_run_id}"  # as kfp.local names it: the job root is beside the metrics
    model_dir = run_dir / "train-grpo" / "model"
    shutil.copytree(tiny_model, model_dir)
    evaluation = dsl.Metrics(uri=str(run_dir / "evaluate-model" / "metrics"),
                             metadata={"reward": reward, "baseline_reward": 0.5, "improvement": reward - 0.5,
                                       **champion})
    if samples:
        job = run_dir / "evaluate-model" / "job"
        job.mkdir(parents=True)
        (job / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    comparison = dsl.HTML(uri=str(run_dir / "register-model" / "comparison"))
    comparison.path  # noqa: B018 - makes nothing; the component writes to .path
    (run_dir / "register-model").mkdir(parents=True)
    version = register_model.python_func(model=dsl.Model(uri=str(model_dir), metadata={"stage": "grpo"}),
                                         evaluation=evaluation, comparison=comparison, name=NAME,
                                         parent_run_id=parent, run_id=kfp_run_id, pipeline="rlhf-grpo")
    return version, parent, stage, model_dir, comparison


def aliases(client) -> dict[str, str]:
    return {alias: str(version) for alias, version in client.get_registered_model(NAME).aliases.items()}


def test_first_candidate_is_registered_tagged_linked_and_becomes_champion(tmp_path, tiny_model, tracking):
    version, parent, stage, model_dir, _ = gate(tmp_path, tiny_model, tracking, "kfp-1", reward=0.8)
    assert version == "1"
    assert aliases(tracking) == {"candidate": "1", "champion": "1"}
    registered = tracking.get_model_version(NAME, "1")
    assert registered.run_id == stage  # the version links to the stage run, nested under the pipeline's run
    assert registered.source == str(model_dir)  # the exported copy itself: no second copy of the weights
    assert registered.tags["alignflow.pipeline_run_id"] == "kfp-1"
    assert registered.tags["alignflow.pipeline"] == "rlhf-grpo"
    assert float(registered.tags["metric.reward"]) == 0.8
    assert tracking.list_artifacts(stage) == [] and tracking.list_artifacts(parent) == []
    assert tracking.get_run(parent).data.tags["alignflow.registered_model"] == f"{NAME}/1"


def test_a_stage_run_below_kfps_task_and_group_runs_is_still_the_versions_run(tracking):
    """KFP 2.17's MLflow integration puts its runs for the exit handler, an If and the task between the pipeline's
    run and the stage's (components/lineage/kfp_mlflow.py)."""
    from components.register.registry import find_stage_run

    experiment = tracking.create_experiment("KFP-Default")

    def run(parent: str = "", **tags) -> str:
        tags = {**tags, "mlflow.parentRunId": parent} if parent else tags
        return tracking.create_run(experiment, tags=tags).info.run_id

    pipeline = run(**{"alignflow.kind": "pipeline"})
    task = run(run(run(pipeline)))  # exit-handler-1 > condition-2 > train-grpo
    stage = run(task, **{"alignflow.task": "grpo"})
    run(run(), **{"alignflow.task": "grpo"})  # another pipeline run's, newer
    assert find_stage_run(tracking, experiment, pipeline, "grpo") == stage
    assert find_stage_run(tracking, experiment, pipeline, "dpo") is None


def test_the_registered_model_loads_through_mlflow_from_where_it_lies(tmp_path, tiny_model, tracking, monkeypatch):
    import mlflow

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    gate(tmp_path, tiny_model, tracking, "kfp-1", reward=0.8)
    mlflow.set_tracking_uri(tracking.tracking_uri)
    model = mlflow.pyfunc.load_model(f"models:/{NAME}@champion")
    [answer] = model.predict(["12+30="])
    assert isinstance(answer, str) and answer


def test_champion_moves_only_to_a_candidate_that_beats_it(tmp_path, tiny_model, tracking):
    gate(tmp_path, tiny_model, tracking, "kfp-1", reward=0.8)
    assert gate(tmp_path, tiny_model, tracking, "kfp-2", reward=0.7)[0] == "2"
    assert aliases(tracking) == {"candidate": "2", "champion": "1"}  # registered, but worse than the champion
    assert tracking.get_model_version(NAME, "2").tags["alignflow.champion"] == "false"
    assert gate(tmp_path, tiny_model, tracking, "kfp-3", reward=0.9)[0] == "3"
    assert aliases(tracking) == {"candidate": "3", "champion": "3"}


def test_the_champion_is_compared_by_its_live_score_not_the_one_recorded_at_registration(tmp_path, tiny_model,
                                                                                         tracking):
    gate(tmp_path, tiny_model, tracking, "kfp-1", reward=0.8)  # recorded: metric.reward 0.8
    # This run's evaluation scored champion version 1 at 0.6 (other prompts, another checker since): 0.7 beats it.
    *_, comparison = gate(tmp_path, tiny_model, tracking, "kfp-2", reward=0.7, champion_version=1.0,
                          champion_reward=0.6)
    assert aliases(tracking) == {"candidate": "2", "champion": "2"}
    second = tracking.get_model_version(NAME, "2").tags
    assert second["alignflow.compared_with"] == "champion version 1 (scored in this evaluation)"
    assert "metric.champion_reward" not in second and "metric.champion_version" not in second  # not its own scores
    page = open(comparison.path).read()
    assert "beats champion version 1" in page and "was scored by this run's evaluation" in page
    assert "<td>0.7</td><td>0.5</td><td><span class='better'>+0.2</span></td><td>0.6</td>" in page
    # And the other way: a live score above the candidate keeps the champion, whatever its recorded score.
    tracking.set_model_version_tag(NAME, "2", "metric.reward", "0.1")
    gate(tmp_path, tiny_model, tracking, "kfp-3", reward=0.75, champion_version=2.0, champion_reward=0.9)
    assert aliases(tracking) == {"candidate": "3", "champion": "2"}


def test_a_champion_that_changed_after_the_evaluation_is_compared_by_its_recorded_score(tmp_path, tiny_model,
                                                                                      tracking):
    gate(tmp_path, tiny_model, tracking, "kfp-1", reward=0.8)
    gate(tmp_path, tiny_model, tracking, "kfp-2", reward=0.9)  # version 2 became champion meanwhile
    *_, comparison = gate(tmp_path, tiny_model, tracking, "kfp-3", reward=0.85, champion_version=1.0,
                          champion_reward=0.8)
    assert aliases(tracking) == {"candidate": "3", "champion": "2"}  # 0.85 < version 2's recorded 0.9
    assert tracking.get_model_version(NAME, "3").tags["alignflow.compared_with"] == \
        "champion version 2 (recorded score)"
    assert "compared with the scores recorded when it was registered" in open(comparison.path).read()


def test_gate_report_puts_candidate_baseline_champion_and_samples_side_by_side(tmp_path, tiny_model, tracking,
                                                                              monkeypatch):
    monkeypatch.setenv("ALIGNFLOW_MLFLOW_EXTERNAL_URL", "https://mlflow.example.com/")
    gate(tmp_path, tiny_model, tracking, "kfp-1", reward=0.8)
    samples = [{"prompt": "12+30=", "response": "42", "score": 1.0, "baseline_response": "41<b>",
                "baseline_score": 0.0}]
    *_, comparison = gate(tmp_path, tiny_model, tracking, "kfp-2", reward=0.7, samples=samples)
    page = open(comparison.path).read()
    assert "does not beat champion version 1" in page
    assert "<td>0.7</td><td>0.5</td><td><span class='better'>+0.2</span></td><td>0.8</td>" \
           "<td><span class='worse'>-0.1</span></td>" in page
    assert "<td>12+30=</td><td>42</td><td>1</td><td>41&lt;b&gt;</td><td>0</td>" in page  # escaped
    assert "href='https://mlflow.example.com/#/models/alignflow-grpo/versions/2'" in page
    assert comparison.metadata == {"version": "2", "champion": False}


def test_kfp_minio_uris_are_s3_to_mlflow():
    assert registry_source("minio://mlpipeline/v2/artifacts/run/model") == "s3://mlpipeline/v2/artifacts/run/model"
    assert registry_source("s3://bucket/model") == "s3://bucket/model"
