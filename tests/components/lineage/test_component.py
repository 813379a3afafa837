"""open_lineage and finish_run against a real MLflow store (sqlite) and real files: the parent run, its
tags and dataset inputs, the manifest check, a retried task, and closing with the final state."""

from __future__ import annotations

import hashlib
import json

import pytest
from kfp import dsl

from components.lineage.component import finish_run, open_lineage
from trainer.errors import PipelineError


@pytest.fixture
def tracking(tmp_path, monkeypatch):
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_ID", raising=False)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    monkeypatch.delenv("KFP_MLFLOW_CONFIG", raising=False)  # KFP's MLflow integration off (covered below)
    return MlflowClient(uri)


@pytest.fixture
def datasets(tmp_path):
    files = {"sft_train": tmp_path / "sft.jsonl", "eval_prompts": tmp_path / "eval.jsonl"}
    files["sft_train"].write_text('{"prompt": "1+1=", "completion": "2"}\n')
    files["eval_prompts"].write_text('{"prompt": "2+2=", "answer": "4"}\n')
    return {name: str(path) for name, path in files.items()}


def sha256(path: str) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def open_run(datasets: dict, expected: dict | None = None, run_id: str = "kfp-run-1") -> str:
    return open_lineage.python_func(pipeline="rlhf-dpo", pipeline_version="0.1.0", run_id=run_id,
                                    dataset_names=[*datasets, "unused"], dataset_uris=[*datasets.values(), ""],
                                    base_model_uri="s3://models/base", dataset_sha256=expected or {})


def test_parent_run_is_tagged_and_logs_each_dataset_with_its_hash(tracking, datasets):
    parent = tracking.get_run(open_run(datasets, {datasets["sft_train"]: sha256(datasets["sft_train"])}))
    assert parent.data.tags["alignflow.pipeline_run_id"] == "kfp-run-1"
    assert parent.data.tags["alignflow.pipeline"] == "rlhf-dpo"
    assert parent.data.tags["alignflow.pipeline_version"] == "0.1.0"
    assert parent.data.tags["alignflow.kind"] == "pipeline"
    assert parent.data.params["base_model_uri"] == "s3://models/base"
    logged = {d.dataset.name: d for d in parent.inputs.dataset_inputs}
    assert sorted(logged) == ["eval_prompts", "sft_train"]  # the empty URI is skipped
    for name, uri in datasets.items():
        assert json.loads(logged[name].dataset.source) == {"uri": uri}
        assert json.loads(logged[name].dataset.profile)["sha256"] == sha256(uri)
    assert {t.key: t.value for t in logged["eval_prompts"].tags}["mlflow.data.context"] == "eval"
    assert {t.key: t.value for t in logged["sft_train"].tags}["mlflow.data.context"] == "train"


def test_data_that_differs_from_its_manifest_fails_before_a_run_is_opened(tracking, datasets):
    wrong = "0" * 64
    with pytest.raises(PipelineError, match=f"{datasets['sft_train']}: content SHA-256 is .* manifest expects {wrong}"):
        open_run(datasets, {datasets["sft_train"]: wrong})
    assert tracking.search_experiments()[0].name == "Default"  # nothing was written to MLflow
    assert len(tracking.search_experiments()) == 1


def test_a_manifest_hash_for_a_uri_the_run_does_not_use_is_an_error(tracking, datasets):
    with pytest.raises(PipelineError, match="names \\['s3://elsewhere/x.jsonl'\\]"):
        open_run(datasets, {"s3://elsewhere/x.jsonl": "a" * 64})


def test_a_retried_task_reuses_the_parent_run_it_opened(tracking, datasets):
    first = open_run(datasets)
    assert open_run(datasets) == first
    assert open_run(datasets, run_id="kfp-run-2") != first


@pytest.mark.parametrize(("state", "expected"), [("SUCCEEDED", "FINISHED"), ("FAILED", "FAILED"),
                                                  ("CANCELED", "KILLED")])
def test_finish_run_closes_the_parent_run_with_the_pipelines_final_state(tracking, datasets, state, expected):
    parent = open_run(datasets)
    status = dsl.PipelineTaskFinalStatus(state=state, pipeline_job_resource_name="runs/kfp-run-1",
                                         pipeline_task_name="run-stages", error_code=None,
                                         error_message="train-dpo failed" if state == "FAILED" else None)
    assert finish_run.python_func(run_id="kfp-run-1", status=status, launcher_mode="local") == expected
    run = tracking.get_run(parent)
    assert run.info.status == expected
    assert (run.data.tags.get("alignflow.error") == "train-dpo failed") == (state == "FAILED")


def test_finish_run_without_a_parent_run_closes_nothing(tracking):
    status = dsl.PipelineTaskFinalStatus(state="FAILED", pipeline_job_resource_name="r", pipeline_task_name="t",
                                         error_code=None, error_message="open-lineage failed")
    assert finish_run.python_func(run_id="never-opened", status=status, launcher_mode="local") == ""


def test_under_kfps_mlflow_integration_the_lineage_goes_on_kfps_run_and_kfp_closes_it(tracking, datasets,
                                                                                       monkeypatch):
    """KFP_MLFLOW_CONFIG alone (KFP 2.17's default: no MLFLOW_RUN_ID in the task) names KFP's pipeline run."""
    experiment = tracking.create_experiment("KFP-Default")
    kfp_run = tracking.create_run(experiment, run_name="rlhf-dpo run", tags={"kfp.pipeline_run_id": "kfp-run-1"})
    config = {"endpoint": tracking.tracking_uri, "parentRunId": kfp_run.info.run_id, "experimentId": experiment,
              "authType": "none", "timeout": "30s"}
    monkeypatch.setenv("KFP_MLFLOW_CONFIG", json.dumps(config))
    assert open_run(datasets) == kfp_run.info.run_id  # no second parent
    run = tracking.get_run(kfp_run.info.run_id)
    assert run.data.tags["alignflow.kind"] == "pipeline" and run.data.params["base_model_uri"] == "s3://models/base"
    assert len(tracking.search_runs([experiment])) == 1
    status = dsl.PipelineTaskFinalStatus(state="SUCCEEDED", pipeline_job_resource_name="runs/kfp-run-1",
                                         pipeline_task_name="run-stages", error_code=None, error_message=None)
    assert finish_run.python_func(run_id="kfp-run-1", status=status, launcher_mode="local") == "FINISHED"
    assert tracking.get_run(kfp_run.info.run_id).info.status == "RUNNING"  # KFP's API server closes its own runs
