"""One MLflow tree per pipeline run, with KFP 2.17's MLflow integration at its defaults and without it.

A small pipeline shaped like alignflow's (open_lineage, then inside the exit handler finish_run a `dsl.If` around
train_sft in local mode, wired by pipelines/steps.py's `stage_arguments`) runs on kfp.local. With the integration on,
what KFP 2.17 does around each task is played by tests/integration/kfp_mlflow_standin.py at KFP's defaults: no
`injectUserEnvVars`, so a task has KFP_MLFLOW_CONFIG and nothing else. MLflow is a real
`mlflow server --enable-workspaces` behind tests/integration/mlflow_gateway.py, which refuses any request without
the service-account token or the workspace, as KFP's default `kubernetes` auth with workspaces does.

Where a pod would read its service-account token (/var/run/secrets/kubernetes.io/serviceaccount/token: the
component pod's own, or the projected one of a training pod, pod/mlflow_token.py), MLflow's `kubernetes` auth
here falls back to the kubeconfig (KUBECONFIG), whose user's `tokenFile` is the token file the gateway checks. The
component learns nothing else: the auth mode and the workspace come from KFP_MLFLOW_CONFIG, through alignflow.
"""

# No `from __future__ import annotations`: KFP reads the pipeline function's annotations as types.
import os
import secrets
import uuid

import pytest
import yaml

from tests.integration.kfp_mlflow_standin import KfpMlflowPlugin
from tests.integration.mlflow_gateway import MlflowGateway
from tests.integration.services import start_mlflow, stop

pytestmark = pytest.mark.slow  # kfp.local runs, each training a tiny SFT stage in a local job
NAMESPACE = "team-a"
CLIENT_SETTINGS = ("MLFLOW_TRACKING_URI", "MLFLOW_RUN_ID", "MLFLOW_EXPERIMENT_ID", "MLFLOW_EXPERIMENT_NAME",
                   "MLFLOW_TRACKING_AUTH", "MLFLOW_WORKSPACE", "ALIGNFLOW_PARENT_RUN_ID", "KFP_MLFLOW_CONFIG")


def lineage_pipeline():
    from kfp import dsl

    from components.lineage.component import finish_run, open_lineage
    from components.sft.component import train_sft
    from pipelines.steps import stage_arguments

    @dsl.pipeline(name="kfp-mlflow")
    def pipeline(base_model_uri: str, sft_train_uri: str, sft_eval_uri: str):
        lineage = open_lineage(pipeline="kfp-mlflow", pipeline_version="test", run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
                               dataset_names=["sft_train"], dataset_uris=[sft_train_uri],
                               base_model_uri=base_model_uri)
        finish = finish_run(run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER, launcher_mode="local")
        cluster = {"run_id": dsl.PIPELINE_JOB_ID_PLACEHOLDER, "launcher_mode": "local", "trainer_image": "",
                   "num_nodes": 1, "gpus_per_node": 0, "s3_secret": ""}
        with dsl.ExitHandler(finish, name="run-stages"):
            train = dsl.importer(artifact_uri=sft_train_uri, artifact_class=dsl.Dataset, reimport=False)
            held_out = dsl.importer(artifact_uri=sft_eval_uri, artifact_class=dsl.Dataset, reimport=False)
            with dsl.If(lineage.output != "", name="lineage-opened"):
                train_sft(train_dataset=train.output, eval_dataset=held_out.output, base_model_uri=base_model_uri,
                          lr=2e-3, micro_batch_size=4, max_length=64, **stage_arguments(cluster, lineage, {}),
                          settings={"train.max_steps": 2, "train.log_interval": 1})

    return pipeline


def run_pipeline(tmp_path, tiny_model, task_files):
    from kfp import local

    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(tmp_path / "root"))
    lineage_pipeline()(base_model_uri=str(tiny_model), sft_train_uri=str(task_files["sft_train"]),
                       sft_eval_uri=str(task_files["sft_eval"]))


def runs_tagged(client, experiment_ids: list[str], **tags) -> list:
    query = " and ".join(f"tags.`{key}` = '{value}'" for key, value in tags.items())
    return client.search_runs(experiment_ids, query)


@pytest.fixture(scope="module")
def workspace_mlflow(tmp_path_factory):
    """A real MLflow server with workspaces, and the namespace's workspace in it."""
    from mlflow import MlflowClient

    folder = tmp_path_factory.mktemp("mlflow-workspaces")
    process, uri = start_mlflow(folder, str(folder / "artifacts"), {}, ("--enable-workspaces",))
    MlflowClient(uri).create_workspace(NAMESPACE)
    yield uri
    stop(process)


@pytest.fixture
def kubernetes_auth(tmp_path, monkeypatch, workspace_mlflow):
    """MLflow at KFP's default auth (the gateway), the pods' service-account token, and no MLflow settings at all
    in the environment the tasks inherit."""
    for name in CLIENT_SETTINGS:
        monkeypatch.delenv(name, raising=False)
    token_file = tmp_path / "serviceaccount-token"
    token_file.write_text(secrets.token_urlsafe(32))
    kubeconfig = {"apiVersion": "v1", "kind": "Config", "current-context": "pod",
                  "clusters": [{"name": "cluster", "cluster": {"server": "https://127.0.0.1:9"}}],
                  "users": [{"name": "pod", "user": {"tokenFile": str(token_file)}}],
                  "contexts": [{"name": "pod", "context": {"cluster": "cluster", "user": "pod",
                                                           "namespace": NAMESPACE}}]}
    (tmp_path / "kubeconfig").write_text(yaml.safe_dump(kubeconfig))
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "kubeconfig"))
    with MlflowGateway(workspace_mlflow, token_file, NAMESPACE) as gateway:
        yield gateway


@pytest.mark.parametrize("inject_user_env_vars", [False, True], ids=["kfp-defaults", "injectUserEnvVars"])
def test_stage_runs_nest_under_kfps_group_and_task_runs_whether_or_not_kfp_names_the_task_run(
        inject_user_env_vars, kubernetes_auth, monkeypatch, tmp_path, tiny_model, task_files, capfd):
    from mlflow import MlflowClient

    gateway = kubernetes_auth
    kfp = KfpMlflowPlugin(gateway.endpoint, gateway.token_file, NAMESPACE, experiment=f"e-{uuid.uuid4().hex[:8]}",
                          inject_user_env_vars=inject_user_env_vars)
    kfp.install(monkeypatch)
    run_pipeline(tmp_path, tiny_model, task_files)
    assert gateway.refused == []  # every call, KFP's and alignflow's, showed the token and the workspace
    # The token reached MLflow only: not the tasks' logs, nor any file of the run (configs, reports, job logs).
    token = gateway.token_file.read_text()
    assert token not in "".join(capfd.readouterr())
    assert [path for path in (tmp_path / "root").rglob("*") if path.is_file() and token.encode() in path.read_bytes()
            ] == []

    # Read the tree straight from the MLflow server behind the gateway, in the namespace's workspace.
    monkeypatch.setenv("MLFLOW_WORKSPACE", NAMESPACE)
    client, experiments = MlflowClient(f"http://{gateway.upstream}"), [kfp.experiment_id]
    # One tree: KFP's pipeline run carries the lineage; alignflow opened no parent of its own, anywhere.
    [pipeline_run] = runs_tagged(client, experiments, **{"alignflow.kind": "pipeline"})
    assert pipeline_run.info.run_id == kfp.pipeline_run
    assert pipeline_run.data.tags["kfp.pipeline_run_id"] == kfp.kfp_run_id
    assert pipeline_run.data.params["base_model_uri"] == str(tiny_model)
    assert [d.dataset.name for d in pipeline_run.inputs.dataset_inputs] == ["sft_train"]
    everywhere = [e.experiment_id for e in client.search_experiments()]
    this_run = {"alignflow.pipeline_run_id": pipeline_run.data.tags["alignflow.pipeline_run_id"]}
    assert len(runs_tagged(client, everywhere, **{"alignflow.kind": "pipeline"}, **this_run)) == 1
    # KFP's nesting: pipeline run > exit handler > If > train-sft; the stage's run under its task's run.
    runs = kfp.runs
    exit_handler = next(name for name in runs if name.startswith("exit-handler"))
    condition = next(name for name in runs if name.startswith("condition"))
    parent = {name: client.get_run(run_id).data.tags["mlflow.parentRunId"] for name, run_id in runs.items()}
    assert parent[exit_handler] == kfp.pipeline_run
    assert parent[condition] == runs[exit_handler] and parent["train-sft"] == runs[condition]
    assert parent["open-lineage"] == parent["finish-run"] == kfp.pipeline_run
    [stage] = runs_tagged(client, experiments, **{"alignflow.kind": "stage"})
    assert stage.data.tags["mlflow.parentRunId"] == runs["train-sft"]
    assert stage.info.status == "FINISHED" and len(client.get_metric_history(stage.info.run_id, "loss")) == 2
    # KFP's runs are KFP's to close: the exit handler left the pipeline's run open for KFP's API server.
    assert client.get_run(kfp.pipeline_run).info.status == "RUNNING"
    # All of it in the namespace's workspace: the default workspace has none of it.
    monkeypatch.delenv("MLFLOW_WORKSPACE")
    assert kfp.experiment_id not in [e.experiment_id for e in client.search_experiments()]


def test_the_stand_in_refuses_a_request_without_the_token_or_the_workspace(kubernetes_auth):
    import urllib.error
    import urllib.request

    gateway = kubernetes_auth
    token = gateway.token_file.read_text()
    attempts = {"no token": {"X-MLflow-Workspace": NAMESPACE},
                "another token": {"Authorization": "Bearer forged", "X-MLflow-Workspace": NAMESPACE},
                "no workspace": {"Authorization": f"Bearer {token}"},
                "another workspace": {"Authorization": f"Bearer {token}", "X-MLflow-Workspace": "team-b"}}
    for headers in attempts.values():
        request = urllib.request.Request(f"{gateway.endpoint}/api/2.0/mlflow/experiments/search?max_results=1",
                                         headers=headers)
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=10)
        assert refused.value.code in (401, 403)
    assert [r["reason"] for r in gateway.refused] == ["no valid service-account token", "no valid service-account "
                                                      "token", "no workspace", "the token may not use workspace 'team-b'"]
    request = urllib.request.Request(f"{gateway.endpoint}/api/2.0/mlflow/experiments/search?max_results=1",
                                     headers={"Authorization": f"Bearer {token}", "X-MLflow-Workspace": NAMESPACE})
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200


def test_without_the_integration_alignflow_opens_and_closes_its_own_parent_run(monkeypatch, mlflow_server, tmp_path,
                                                                               tiny_model, task_files):
    from mlflow import MlflowClient

    for name in CLIENT_SETTINGS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)  # what the chart gives a task pod
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", f"alignflow-{uuid.uuid4().hex[:8]}")
    run_pipeline(tmp_path, tiny_model, task_files)

    client = MlflowClient(mlflow_server)
    experiment = client.get_experiment_by_name(os.environ["MLFLOW_EXPERIMENT_NAME"])
    [pipeline_run] = runs_tagged(client, [experiment.experiment_id], **{"alignflow.kind": "pipeline"})
    [stage] = runs_tagged(client, [experiment.experiment_id], **{"alignflow.kind": "stage"})
    assert stage.data.tags["mlflow.parentRunId"] == pipeline_run.info.run_id
    assert client.get_run(pipeline_run.info.run_id).info.status == "FINISHED"  # closed by finish_run
