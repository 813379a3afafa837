"""rlhf-dpo on an emulated Kubeflow cluster, crossing every joint between pipeline, KFP, Kubernetes and S3.

One run of SFT then DPO, set up as a platform team would (the chart's ConfigMap and Role, the S3
Secret, the pipeline compiled in the chart's upload Job environment), with artifacts under a
pipeline root in the object store. Each component runs as KFP runs it (the IR's command and args,
`kfp.dsl.executor_main`, exactly the env the IR's kubernetes section declares, resolved from the
Secret and ConfigMap in the API), creates its PyTorchJob through the Kubernetes API with its
service account token, and each replica runs the manifest's command with the operator's env. The
API answers the DPO stage's watch with 503 twice and drops one connection while its job runs.
Nothing passes between pods but the object store. About 40 seconds on 2 cores.
"""

from __future__ import annotations

import json
import urllib.request

import pytest

from tests.cluster.apiserver import Fault
from tests.cluster.conftest import NAMESPACE, PIPELINE_ROOT, S3_SECRET, deployment, tiny_arguments
from tests.cluster.kfp_runner import ObjectStore
from tests.cluster.training_operator import condition_true
from tests.integration.services import S3_ENV

STAGES = ("prepare-inputs", "train-sft", "train-dpo")
SKIP = {"evaluate-model"}  # generation on the tiny model says nothing here; the registration gate follows it
OPERATOR_ENV = {"PYTHONUNBUFFERED", "MASTER_ADDR", "MASTER_PORT", "PET_MASTER_ADDR", "PET_MASTER_PORT", "WORLD_SIZE",
                "RANK", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_NNODES"}
KUBELET_ENV = {"HOME", "HOSTNAME", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT",
               "KUBERNETES_SERVICE_PORT_HTTPS", "KUBERNETES_PORT"}


def image_env(cluster, image: str) -> set[str]:
    """What the container's image adds to its environment (PATH and LANG here; a built image's ENV)."""
    return set(cluster.kubelet.image_env(image))


def job_running(cluster, stage: str):
    return lambda: any(job["metadata"]["labels"].get("alignflow/stage") == stage and condition_true(job, "Running")
                       for job in cluster.jobs())


@pytest.fixture(scope="module")
def dpo_run(sandbox, object_store, tracking_server, tiny_inputs, packages, tmp_path_factory):
    with deployment(tmp_path_factory.mktemp("cluster"), packages, object_store,
                    tracking_uri=tracking_server) as platform:
        cluster = platform.cluster
        package = platform.package("rlhf-dpo")
        watch, dpo_running = r"/pytorchjobs$", job_running(cluster, "dpo")
        cluster.api.faults += [Fault("GET", watch, status=503, times=2, watch=True, when=dpo_running),
                               Fault("GET", watch, status=0, times=1, watch=True, when=dpo_running)]
        run = platform.run("rlhf-dpo", tiny_arguments(package, tiny_inputs), skip=SKIP).start()
        # Once DPO's job runs, every open watch ends: the launcher's next watches meet the faults.
        cluster.wait_for(lambda: dpo_running() or not run.running, 600, "the DPO job runs")
        cluster.api.close_watches()
        results = run.join(timeout=600)
        print(run.timings())
        yield platform, run, results


def events(cluster, resource: str) -> list:
    return [event for event in cluster.store.history if event.resource == resource]


def test_sft_then_dpo_run_through_the_object_store_alone(dpo_run, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    platform, run, results = dpo_run
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


def test_component_pods_get_exactly_the_environment_the_compiled_pipeline_declares(dpo_run):
    from tests.cluster.kfp_ir import load_package

    platform, _, results = dpo_run
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


def test_each_job_replica_ran_the_manifest_command_with_the_operators_environment(dpo_run):
    platform, run, _ = dpo_run
    cluster = platform.cluster
    jobs = {e.object["metadata"]["labels"]["alignflow/stage"]: e.object
            for e in events(cluster, "pytorchjobs") if e.type == "ADDED"}
    assert sorted(jobs) == ["dpo", "sft"]
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


def test_watch_errors_neither_delete_the_running_job_nor_fail_the_task(dpo_run):
    platform, _, results = dpo_run
    cluster = platform.cluster
    assert [fault.hits for fault in cluster.api.faults] == [2, 1]
    dpo_job = next(e.object for e in events(cluster, "pytorchjobs") if e.type == "ADDED"
                   and e.object["metadata"]["labels"]["alignflow/stage"] == "dpo")
    name = dpo_job["metadata"]["name"]
    deleted = next(e for e in events(cluster, "pytorchjobs") if e.type == "DELETED" and e.object["metadata"]["name"] == name)
    assert condition_true(deleted.object, "Succeeded"), "the job was deleted before it finished"
    assert results["train-dpo"].state == "SUCCEEDED"


def test_no_field_of_any_job_is_pruned_by_the_crd(dpo_run):
    platform, _, _ = dpo_run
    assert platform.cluster.api.warnings == []
    assert platform.cluster.api.calls("create", "pytorchjobs")  # the jobs went through the validating API


def test_exit_handler_leaves_no_job_behind(dpo_run):
    platform, run, results = dpo_run
    exit_tasks = [name for name, task in run.spec["root"]["dag"]["tasks"].items()
                  if task.get("triggerPolicy", {}).get("strategy") == "ALL_UPSTREAM_TASKS_COMPLETED"]
    assert exit_tasks and all(results[name].state == "SUCCEEDED" for name in exit_tasks)
    assert platform.cluster.jobs() == []


def test_stages_tracked_to_the_platforms_mlflow(dpo_run, tracking_server):
    def call(path: str, body: dict) -> dict:
        request = urllib.request.Request(f"{tracking_server}/api/2.0/mlflow/{path}", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())

    _, run, _ = dpo_run
    experiments = call("experiments/search", {"max_results": 100}).get("experiments", [])
    runs = call("runs/search", {"experiment_ids": [e["experiment_id"] for e in experiments], "max_results": 100})
    tagged = [r for r in runs.get("runs", []) if run.run_id in json.dumps(r["data"].get("tags", []))]
    assert len(tagged) >= 2, "the SFT and DPO jobs did not track to the MLflow server the platform configured"
