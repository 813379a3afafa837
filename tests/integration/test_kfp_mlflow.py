"""One MLflow tree per pipeline run, with and without KFP's own MLflow integration (KFP 2.17, KEP-12862).

A small pipeline (open_lineage -> train_sft in local mode -> finish_run as the exit handler) runs on kfp.local
against a real `mlflow server`. With the integration on, what KFP's backend does around each task is reproduced
from its source (kubeflow/pipelines 2.17.0):
- the API server opens the pipeline's run, tagged `kfp.pipeline_run_id` and `kfp.pipeline_run_url`
  (`backend/src/apiserver/plugins/mlflow/run_start.go`, `BuildKFPTags`);
- the driver opens each task's nested run, named after the task, tagged `mlflow.parentRunId` = the pipeline's run,
  in the same experiment (`backend/src/v2/common/plugins/mlflow/handler.go`, `OnTaskStart`), and gives the user
  container `MLFLOW_RUN_ID` (that run), `MLFLOW_TRACKING_URI` and `MLFLOW_EXPERIMENT_ID`
  (`RetrieveUserContainerEnvVars`);
- the launcher marks the task's run FINISHED or FAILED when it ends (`OnTaskEnd`).
kfp.local has no driver, so `KfpMlflowBackend` does those three things around kfp.local's task subprocess.
"""


import os
import uuid

import pytest

pytestmark = pytest.mark.slow  # two kfp.local runs, each training a tiny SFT stage in a local job


def lineage_pipeline():
    from kfp import dsl

    from components.lineage.component import finish_run, open_lineage
    from components.sft.component import train_sft

    @dsl.pipeline(name="kfp-mlflow")
    def pipeline(base_model_uri: str, sft_train_uri: str, sft_eval_uri: str):
        lineage = open_lineage(pipeline="kfp-mlflow", pipeline_version="test", run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
                               dataset_names=["sft_train"], dataset_uris=[sft_train_uri],
                               base_model_uri=base_model_uri)
        finish = finish_run(run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER, launcher_mode="local")
        with dsl.ExitHandler(finish):
            train = dsl.importer(artifact_uri=sft_train_uri, artifact_class=dsl.Dataset, reimport=False)
            held_out = dsl.importer(artifact_uri=sft_eval_uri, artifact_class=dsl.Dataset, reimport=False)
            train_sft(train_dataset=train.output, eval_dataset=held_out.output, run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
                      base_model_uri=base_model_uri, lr=2e-3, micro_batch_size=4, max_length=64,
                      settings={"train.max_steps": 2, "train.log_interval": 1}, launcher_mode="local",
                      gpus_per_node=0, parent_run_id=lineage.output)

    return pipeline


class KfpMlflowBackend:
    """KFP's API server, driver and launcher as far as MLflow goes (see the module docstring)."""

    def __init__(self, tracking_uri: str) -> None:
        from mlflow import MlflowClient

        self.tracking_uri = tracking_uri
        self.client = MlflowClient(tracking_uri)
        name = f"kfp-{uuid.uuid4().hex[:8]}"
        self.experiment_id = self.client.create_experiment(name)
        kfp_run = str(uuid.uuid4())
        self.parent = self.client.create_run(self.experiment_id, run_name="kfp-mlflow run", tags={
            "kfp.pipeline_run_id": kfp_run, "kfp.pipeline_run_url": f"http://kfp/#/runs/details/{kfp_run}"},
        ).info.run_id
        self.task_runs: dict[str, str] = {}

    def wrap(self, handler_class) -> object:
        """A replacement `run` for kfp.local's subprocess task handler: the driver's and launcher's work around it."""
        original = handler_class.run
        backend = self

        def run(handler):
            command = handler.full_command
            task = command[command.index("--function_to_execute") + 1].replace("_", "-")
            run_id = backend.client.create_run(backend.experiment_id, run_name=task,
                                               tags={"mlflow.parentRunId": backend.parent}).info.run_id
            backend.task_runs[task] = run_id
            handler.env_vars = {**handler.env_vars, "MLFLOW_RUN_ID": run_id,
                                "MLFLOW_TRACKING_URI": backend.tracking_uri,
                                "MLFLOW_EXPERIMENT_ID": backend.experiment_id}
            outcome = original(handler)
            backend.client.set_terminated(run_id, status="FINISHED" if outcome.name == "SUCCESS" else "FAILED")
            return outcome

        return run


def run_pipeline(tmp_path, tiny_model, task_files):
    from kfp import local

    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(tmp_path / "root"))
    lineage_pipeline()(base_model_uri=str(tiny_model), sft_train_uri=str(task_files["sft_train"]),
                       sft_eval_uri=str(task_files["sft_eval"]))


def runs_tagged(client, experiment_ids: list[str], **tags) -> list:
    query = " and ".join(f"tags.`{key}` = '{value}'" for key, value in tags.items())
    return client.search_runs(experiment_ids, query)


@pytest.fixture
def platform_env(monkeypatch, mlflow_server):
    """What the chart gives a task pod: the platform's tracking URI, no run of KFP's."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
    for name in ("MLFLOW_RUN_ID", "MLFLOW_EXPERIMENT_ID", "MLFLOW_EXPERIMENT_NAME", "ALIGNFLOW_PARENT_RUN_ID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", f"alignflow-{uuid.uuid4().hex[:8]}")
    return mlflow_server


def test_with_kfps_mlflow_integration_stages_nest_under_kfps_task_runs(platform_env, monkeypatch, tmp_path,
                                                                         tiny_model, task_files):
    from kfp.local import subprocess_task_handler

    backend = KfpMlflowBackend(platform_env)
    handler = subprocess_task_handler.SubprocessTaskHandler
    monkeypatch.setattr(handler, "run", backend.wrap(handler))
    run_pipeline(tmp_path, tiny_model, task_files)

    client, experiments = backend.client, [backend.experiment_id]
    # One tree: KFP's pipeline run carries the lineage; alignflow opened no parent of its own, anywhere.
    [pipeline_run] = runs_tagged(client, experiments, **{"alignflow.kind": "pipeline"})
    assert pipeline_run.info.run_id == backend.parent
    assert pipeline_run.data.tags["alignflow.pipeline"] == "kfp-mlflow"
    assert pipeline_run.data.params["base_model_uri"] == str(tiny_model)
    assert [d.dataset.name for d in pipeline_run.inputs.dataset_inputs] == ["sft_train"]
    everywhere = [e.experiment_id for e in client.search_experiments()]
    assert len(runs_tagged(client, everywhere, **{"alignflow.kind": "pipeline"})) == 1
    # The stage's run nests under the run KFP made for the train-sft task, in KFP's experiment.
    [stage] = runs_tagged(client, experiments, **{"alignflow.kind": "stage"})
    assert stage.data.tags["mlflow.parentRunId"] == backend.task_runs["train-sft"]
    assert client.get_run(backend.task_runs["train-sft"]).data.tags["mlflow.parentRunId"] == backend.parent
    assert stage.info.status == "FINISHED" and len(client.get_metric_history(stage.info.run_id, "loss")) == 2
    # KFP's runs are KFP's to close: the exit handler left the pipeline's run open for KFP's API server.
    assert client.get_run(backend.parent).info.status == "RUNNING"
    assert set(backend.task_runs) == {"open-lineage", "train-sft", "finish-run"}


def test_without_it_alignflow_opens_and_closes_its_own_parent_run(platform_env, tmp_path, tiny_model, task_files):
    from mlflow import MlflowClient

    run_pipeline(tmp_path, tiny_model, task_files)

    client = MlflowClient(platform_env)
    experiment = client.get_experiment_by_name(os.environ["MLFLOW_EXPERIMENT_NAME"])
    [pipeline_run] = runs_tagged(client, [experiment.experiment_id], **{"alignflow.kind": "pipeline"})
    [stage] = runs_tagged(client, [experiment.experiment_id], **{"alignflow.kind": "stage"})
    assert stage.data.tags["mlflow.parentRunId"] == pipeline_run.info.run_id
    assert client.get_run(pipeline_run.info.run_id).info.status == "FINISHED"  # closed by finish_run
