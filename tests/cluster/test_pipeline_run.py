"""rlhf-dpo on an emulated Kubeflow cluster, crossing every joint between pipeline, KFP, Kubernetes and S3.

One run of SFT then DPO on each kind of cluster: one that serves only Kubeflow Trainer v2 (the
stages' jobs are TrainJobs, created by the Kubeflow SDK) and one that serves only the Training
Operator v1 (PyTorchJobs), each set up as a platform team would (the chart's ConfigMap, Role and, where
Trainer runs, its TrainingRuntime; the S3 Secret; the pipeline compiled in the chart's upload Job
environment), with the chart's `training.jobKind` left `auto`, and artifacts under a pipeline root in
the object store. The Trainer cluster's chart has `training.initializers.enabled`: each stage's base model (the
run's parameter for SFT, SFT's Model artifact for DPO) is fetched by the runtime's model initializer into the
JobSet's claim before the trainer's node starts, and the trainer loads it from /workspace/model; the PyTorchJob
run's trainers read S3 themselves (the fallback). Each component runs as KFP runs it (the IR's command and args,
`kfp.dsl.executor_main`, exactly the env the IR's kubernetes section declares, resolved from the
Secret and ConfigMap in the API), creates its job through the Kubernetes API with its service account
token, and each pod runs the job's command with the controller's env. The API answers the DPO stage's
follow (a TrainJob's GET, a PyTorchJob's watch) with a 503 and drops one connection while its job
runs. Nothing passes between pods but the object store. About 40-50 seconds a run on 2 cores.
"""

from __future__ import annotations

import json
import urllib.request

import pytest
import yaml

from tests.cluster.apiserver import Fault
from tests.cluster.conftest import (
    KINDS,
    NAMESPACE,
    PIPELINE_ROOT,
    S3_SECRET,
    chart_values,
    deployment,
    tiny_arguments,
)
from tests.cluster.kfp_runner import ExecutionCache, ObjectStore
from tests.cluster.records import MODEL_FILE, logs, request_log, weight_reads
from tests.cluster.training_operator import condition_true
from tests.integration.services import S3_ENV

STAGES = ("prepare-inputs", "train-sft", "train-dpo")
SKIP = {"evaluate-model"}  # generation on the tiny model says nothing here; the registration gate follows it
OPERATOR_ENV = {"PYTHONUNBUFFERED", "MASTER_ADDR", "MASTER_PORT", "PET_MASTER_ADDR", "PET_MASTER_PORT", "WORLD_SIZE",
                "RANK", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_NNODES"}
TORCH_PLUGIN_ENV = {"PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT"}
KUBELET_ENV = {"HOME", "HOSTNAME", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT",
               "KUBERNETES_SERVICE_PORT_HTTPS", "KUBERNETES_PORT"}
# How the launcher follows a job: the Kubeflow SDK reads a TrainJob (GET); a PyTorchJob is watched.
FOLLOW_FAULTS = {"trainjob": (r"/trainjobs/[^/]+$", False), "pytorchjob": (r"/pytorchjobs$", True)}
REPLICATED_JOB = "jobset.sigs.k8s.io/replicatedjob-name"
CHOICE = {"trainjob": "job kind: TrainJob (ALIGNFLOW_JOB_KIND=auto: the API server serves trainer.kubeflow.org/"
                      "v1alpha1 trainjobs and runtime af-alignflow-torch exists)",
          "pytorchjob": "job kind: PyTorchJob (ALIGNFLOW_JOB_KIND=auto: the API server does not serve "
                        "trainer.kubeflow.org/v1alpha1 trainjobs; the API server serves kubeflow.org/v1 pytorchjobs)"}


def image_env(cluster, image: str) -> set[str]:
    """What the container's image adds to its environment (PATH and LANG here; a built image's ENV)."""
    return set(cluster.kubelet.image_env(image))


@pytest.fixture(scope="module")
def prepared():
    """One KFP execution cache for both runs: prepare-inputs copies the datasets once."""
    return ExecutionCache()


@pytest.fixture(scope="module", params=["trainjob", "pytorchjob"])
def dpo_run(request, sandbox, object_store, tracking_server, tiny_inputs, packages, prepared, tmp_path_factory):
    kind = KINDS[request.param]
    values = chart_values(object_store, tracking_server, kind.name)
    if kind.name == "trainjob":  # Trainer's initializers fetch what the stages read; PyTorchJobs have none
        values["training"]["initializers"] = {"enabled": True}
    with deployment(tmp_path_factory.mktemp("cluster"), packages, object_store, values=values,
                    kind=kind.name) as platform:
        cluster = platform.cluster
        package = platform.package("rlhf-dpo")
        path, is_watch = FOLLOW_FAULTS[kind.name]
        dpo_running = kind.running(cluster, "dpo")
        cluster.api.faults += [Fault("GET", path, status=503, times=1, watch=is_watch, when=dpo_running),
                               Fault("GET", path, status=0, times=1, watch=is_watch, when=dpo_running)]
        run = platform.run("rlhf-dpo", tiny_arguments(package, tiny_inputs), skip=SKIP, cache=prepared).start()
        # Once DPO's job runs, every open watch ends: the launcher's next watches meet the faults.
        run.wait_for(dpo_running, 600, "the DPO job runs")
        cluster.api.close_watches()
        results = run.join(timeout=600)
        print(run.timings())
        yield platform, run, results, kind


def events(cluster, resource: str) -> list:
    return [event for event in cluster.store.history if event.resource == resource]


def jobset_pods(cluster, jobset: str, change: str | None = None) -> list[dict]:
    """Each recorded state of the pods of a TrainJob's JobSet, in order (only `change`s: ADDED, MODIFIED, DELETED)."""
    return [e.object for e in events(cluster, "pods") if (change is None or e.type == change)
            and e.object["metadata"]["labels"].get("jobset.sigs.k8s.io/jobset-name") == jobset]


def test_sft_then_dpo_run_through_the_object_store_alone(dpo_run, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    platform, run, results, kind = dpo_run
    ran = {name for name, result in results.items() if result.state != "NOT_RUN" and name not in SKIP}
    assert set(STAGES) <= ran, {name: (r.error, r.log[-3000:]) for name, r in results.items() if r.state == "FAILED"}
    assert {name: results[name].state for name in ran} == dict.fromkeys(ran, "SUCCEEDED"), \
        {name: (results[name].error, results[name].log[-3000:]) for name in ran if results[name].state != "SUCCEEDED"}
    model_uri = results["train-dpo"].artifacts["model"][0]["uri"]
    assert model_uri.startswith(f"{PIPELINE_ROOT}/rlhf-dpo/{run.run_id}/train-dpo/")
    # The SFT model reached DPO through its artifact URI only: DPO's config names it.
    sft_model = results["train-sft"].artifacts["model"][0]["uri"]
    assert results["train-dpo"].executor_input["inputs"]["artifacts"]["base_model"]["artifacts"][0]["uri"] == sft_model
    ObjectStore(platform.endpoint, S3_ENV).download(model_uri, tmp_path / "model")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "model")
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "model")
    assert model(**tokenizer("1+2=", return_tensors="pt")).logits.shape[-1] == model.config.vocab_size


def test_auto_picks_the_kind_the_cluster_serves(dpo_run):
    platform, _, results, kind = dpo_run
    for stage in ("train-sft", "train-dpo"):
        assert CHOICE[kind.name] in results[stage].log, results[stage].log[-2000:]
    assert sorted(j["metadata"]["labels"]["alignflow/stage"] for j in kind.created(platform.cluster)) == ["dpo", "sft"]
    other = "pytorchjobs" if kind.name == "trainjob" else "trainjobs"
    assert not platform.cluster.api.calls("create", other)


def test_component_pods_get_exactly_the_environment_the_compiled_pipeline_declares(dpo_run):
    from tests.cluster.kfp_ir import load_package

    platform, _, results, _ = dpo_run
    spec, executors = load_package(platform.package("rlhf-dpo"))
    declared = executors["exec-train-sft"]
    launcher_image = spec["deploymentSpec"]["executors"]["exec-train-sft"]["container"]["image"]
    names = {m["envVar"] for item in declared.get("secretAsEnv", []) + declared.get("configMapAsEnv", [])
             for m in item["keyToEnv"]}
    env = results["train-sft"].env
    config_map = next(m for m in platform.manifests if m["kind"] == "ConfigMap")["data"]
    assert set(env) == {n for n in names if n in config_map or n.startswith("AWS_")} | KUBELET_ENV | {
        "KFP_POD_NAME", "KFP_POD_UID"} | image_env(platform.cluster, launcher_image)
    assert env["AWS_ACCESS_KEY_ID"] == S3_ENV["AWS_ACCESS_KEY_ID"]  # from the Secret, through the IR
    assert env["AWS_ENDPOINT_URL"] == platform.endpoint and env["MLFLOW_TRACKING_URI"]  # from the ConfigMap
    assert all(not result.not_emulated for result in results.values())


@pytest.mark.parametrize("dpo_run", ["pytorchjob"], indirect=True)  # the same run as the other tests' pytorchjob
def test_each_pytorchjob_replica_ran_the_manifest_command_with_the_operators_environment(dpo_run):
    platform, run, _, kind = dpo_run
    cluster = platform.cluster
    jobs = {job["metadata"]["labels"]["alignflow/stage"]: job for job in kind.created(cluster)}
    for stage, job in jobs.items():
        container = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
        config_uri = container["command"][container["command"].index("--config") + 1]
        assert config_uri.startswith(f"{PIPELINE_ROOT}/rlhf-dpo/{run.run_id}/alignflow-jobs/{stage}/")
        pod = f"{job['metadata']['name']}-master-0"
        runtime = cluster.kubelet.runtime((NAMESPACE, pod))
        declared = {item["name"] for item in container.get("env", [])}
        assert set(runtime.env) == declared | OPERATOR_ENV | KUBELET_ENV | image_env(cluster, container["image"])
        secret_refs = [item for item in container["env"] if "secretKeyRef" in item.get("valueFrom", {})]
        assert {item["valueFrom"]["secretKeyRef"]["name"] for item in secret_refs} == {S3_SECRET}
        assert runtime.env["AWS_SECRET_ACCESS_KEY"] == S3_ENV["AWS_SECRET_ACCESS_KEY"]
        assert runtime.env["MASTER_ADDR"] == pod and runtime.env["WORLD_SIZE"] == "1"


@pytest.mark.parametrize("dpo_run", ["trainjob"], indirect=True)
def test_each_trainjob_ran_the_trainer_command_with_the_torch_plugins_environment(dpo_run):
    platform, run, _, kind = dpo_run
    cluster = platform.cluster
    for job in kind.created(cluster):
        name, stage = job["metadata"]["name"], job["metadata"]["labels"]["alignflow/stage"]
        trainer = job["spec"]["trainer"]
        assert trainer["command"][:5] == ["python", "-m", "trainer.launch", "--nproc-per-node", "1"]
        config_uri = trainer["command"][trainer["command"].index("--config") + 1]
        assert config_uri.startswith(f"{PIPELINE_ROOT}/rlhf-dpo/{run.run_id}/alignflow-jobs/{stage}/")
        assert job["spec"]["runtimeRef"] == {"name": "af-alignflow-torch", "kind": "TrainingRuntime"}
        # One pod per replicated job (the initializers', the trainer's node), one attempt: nothing failed and
        # restarted along the way.
        created = {p["metadata"]["labels"][REPLICATED_JOB]: p for p in jobset_pods(cluster, name, "ADDED")}
        assert len(created) == len(jobset_pods(cluster, name, "ADDED")), name
        assert set(created) == {"dataset-initializer", "model-initializer", "node"}
        assert {p["metadata"]["labels"]["jobset.sigs.k8s.io/restart-attempt"] for p in created.values()} == {"0"}
        pod = created["node"]
        runtime = cluster.kubelet.runtime((NAMESPACE, pod["metadata"]["name"]))
        assert set(runtime.env) == {item["name"] for item in trainer["env"]} | TORCH_PLUGIN_ENV | KUBELET_ENV | \
            image_env(cluster, pod["spec"]["containers"][0]["image"])
        assert runtime.env["PET_MASTER_ADDR"] == f"{name}-node-0-0.{name}" and runtime.env["PET_NODE_RANK"] == "0"
        # Credentials reached the trainer as files of a Secret volume (trainer.launch exports them), never as
        # values in the TrainJob: it carries the Secret's name and the keys only.
        [volume] = [v for p in job["spec"]["runtimePatches"] for rj in p["trainingRuntimeSpec"]["template"]["spec"]
                    ["replicatedJobs"] for v in rj["template"]["spec"]["template"]["spec"].get("volumes", [])
                    if "secret" in v]
        assert volume["secret"]["secretName"] == S3_SECRET
        folder = runtime.fs.host_path(runtime.env["ALIGNFLOW_SECRET_ENV_DIRS"])
        assert (folder / "AWS_SECRET_ACCESS_KEY").read_text() == S3_ENV["AWS_SECRET_ACCESS_KEY"]
        assert not {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} & {item["name"] for item in trainer["env"]}


@pytest.mark.parametrize("dpo_run", ["trainjob"], indirect=True)  # PyTorchJobs have no initializers
def test_each_trainjob_reads_its_base_model_through_the_model_initializer(dpo_run, tiny_inputs, tmp_path_factory):
    platform, run, results, kind = dpo_run
    cluster = platform.cluster
    store = ObjectStore(platform.endpoint, S3_ENV)
    sft_model = results["train-sft"].artifacts["model"][0]["uri"]
    base_models = {"sft": tiny_inputs["base_model_uri"], "dpo": sft_model}  # the parameter, then SFT's Model
    s3_env = [{"name": "ENDPOINT", "value": platform.endpoint}, {"name": "REGION", "value": "us-east-1"}]
    for job in kind.created(cluster):
        name, stage = job["metadata"]["name"], job["metadata"]["labels"]["alignflow/stage"]
        # KFP names the artifact minio:// (the pipeline root); the S3 initializer reads the same key as s3://.
        fetched = "s3://" + base_models[stage].split("://", 1)[1]
        initializer = job["spec"].get("initializer") or {}
        assert initializer.get("model", {}).get("storageUri", "").rstrip("/") == fetched, (stage, initializer)
        assert initializer["model"]["env"] == s3_env
        # JobSet's dependsOn: the model initializer's pod succeeded before the trainer's node pod was created.
        changes = jobset_pods(cluster, name)
        done = next(i for i, p in enumerate(changes) if p["metadata"]["labels"][REPLICATED_JOB] == "model-initializer"
                    and p["status"].get("phase") == "Succeeded")
        node = next(i for i, p in enumerate(changes) if p["metadata"]["labels"][REPLICATED_JOB] == "node")
        assert done < node, stage
        pods = logs(cluster, name)
        assert f"to /workspace/model/{MODEL_FILE}" in pods["model-initializer"], pods["model-initializer"]
        # The trainer loaded its base model from the shared volume: the config it read (the launcher's, in the job
        # root) names /workspace/model, and its log names no S3 location of the model.
        command = job["spec"]["trainer"]["command"]
        bucket, key = store.split(command[command.index("--config") + 1])
        read = yaml.safe_load(store.client.get_object(Bucket=bucket, Key=key)["Body"].read())
        assert read["model"]["path"] == "/workspace/model", stage
        assert base_models[stage].split("://", 1)[1] not in pods["node"], stage
    # The SFT model's weights were read by the KFP launcher into each component pod taking it as an input, and once
    # by DPO's model initializer: never by DPO's trainer.
    downloads = sum(f"from {sft_model} (" in result.log for result in results.values())
    assert downloads >= 1
    assert weight_reads(request_log(store, tmp_path_factory.getbasetemp()), sft_model) == downloads + 1


def test_follow_errors_neither_delete_the_running_job_nor_fail_the_task(dpo_run):
    platform, _, results, kind = dpo_run
    cluster = platform.cluster
    assert [fault.hits for fault in cluster.api.faults] == [1, 1]
    dpo_job = next(job for job in kind.created(cluster) if job["metadata"]["labels"]["alignflow/stage"] == "dpo")
    name = dpo_job["metadata"]["name"]
    deleted = next(e for e in events(cluster, kind.resource) if e.type == "DELETED"
                   and e.object["metadata"]["name"] == name)
    finished = "Complete" if kind.name == "trainjob" else "Succeeded"
    assert condition_true(deleted.object, finished), "the job was deleted before it finished"
    assert results["train-dpo"].state == "SUCCEEDED"


def test_no_field_of_any_job_is_pruned_by_the_crd(dpo_run):
    platform, _, _, kind = dpo_run
    assert platform.cluster.api.warnings == []
    assert platform.cluster.api.calls("create", kind.resource)  # the jobs went through the validating API


def test_exit_handler_leaves_no_job_behind(dpo_run):
    platform, run, results, kind = dpo_run
    exit_tasks = [name for name, task in run.spec["root"]["dag"]["tasks"].items()
                  if task.get("triggerPolicy", {}).get("strategy") == "ALL_UPSTREAM_TASKS_COMPLETED"]
    assert exit_tasks and all(results[name].state == "SUCCEEDED" for name in exit_tasks)
    assert kind.jobs(platform.cluster) == []


def test_stages_tracked_to_the_platforms_mlflow(dpo_run, tracking_server):
    def call(path: str, body: dict) -> dict:
        request = urllib.request.Request(f"{tracking_server}/api/2.0/mlflow/{path}", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())

    _, run, _, _ = dpo_run
    experiments = call("experiments/search", {"max_results": 100}).get("experiments", [])
    runs = call("runs/search", {"experiment_ids": [e["experiment_id"] for e in experiments], "max_results": 100})
    tagged = [r for r in runs.get("runs", []) if run.run_id in json.dumps(r["data"].get("tags", []))]
    assert len(tagged) >= 2, "the SFT and DPO jobs did not track to the MLflow server the platform configured"
