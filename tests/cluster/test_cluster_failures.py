"""What a platform team meets on a real cluster, on the emulated one: each failure named where it happens.

They run on a Kubeflow Trainer v2 cluster (TrainJobs, the kind a cluster set up today runs); the pending
limit runs on a Training Operator cluster (PyTorchJobs) too. A PyTorchJob's cancellation and deletion from
outside are the launcher's shared code, tested against the Kubernetes stand-in for PyTorchJobs
(tests/components/launcher/follow/test_cancellation.py, test_api_failures.py); here they would cost a
pipeline run each.

- a missing Secret or ConfigMap stops the first component pod (the kubelet's CreateContainerConfigError)
  before any job exists;
- a job whose pods cannot be scheduled (too few GPUs) is reported in the component's log with the
  scheduler's reason, and cancelling the run (SIGTERM to the component) deletes the job;
- the pending limit set in the chart's values reaches the component through the defaults ConfigMap,
  and a job stuck Pending past it fails its task with the scheduler's reason;
- a job deleted from outside fails its task at once, saying so;
- a component killed mid-job (OOM, a lost node) is retried by KFP and re-attaches to the job it created
  (slow: about a minute);
- prepared inputs are cached on their content, not their URI (slow);
- an unreachable S3 endpoint fails the first task that needs it with an error naming the endpoint, once
  the retry budget the chart's `s3.retrySeconds` puts into the ConfigMap (ALIGNFLOW_S3_RETRY_SECONDS) is spent.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from tests.cluster import kfp_ir
from tests.cluster.conftest import KINDS, NAMESPACE, S3_SECRET, chart_values, deployment, tiny_arguments
from tests.cluster.kfp_runner import ExecutionCache
from tests.cluster.training_operator import free_port

# Not run here: evaluation (generation on the tiny model says nothing about these failures) and the exit handler
# (covered by test_pipeline_run.py; it would delete the run's jobs itself, so skipping it also makes a job seen
# deleted here one that the failing stage deleted).
SKIP = {"evaluate-model", "finish-run"}


@pytest.fixture(scope="module")
def cache():
    """One KFP execution cache for the module: prepare-inputs, cached on its inputs' content, copies once."""
    return ExecutionCache()
TRAINING = ("train-sft", "train-dpo")


BOTH_KINDS = pytest.mark.parametrize("kind", [KINDS["trainjob"], KINDS["pytorchjob"]], ids=["trainjob", "pytorchjob"])
TRAINJOB = KINDS["trainjob"]  # the kind of the deployment() default: a cluster set up today


def created_jobs(cluster) -> list[dict]:
    """The jobs of any kind created so far."""
    return [job for kind in KINDS.values() for job in kind.created(cluster)]


def first_failure(results):
    return next(result for result in results.values() if result.state == "FAILED" and result.pod)


@pytest.mark.parametrize("missing", ["secret", "config_map"])
def test_missing_secret_or_config_map_fails_before_any_job(missing, sandbox, object_store, tracking_server,
                                                           tiny_inputs, packages, tmp_path):
    with deployment(tmp_path, packages, object_store, tracking_uri=tracking_server,
                    **{missing: False}) as platform:
        package = platform.package("rlhf-dpo")
        results = platform.run("rlhf-dpo", tiny_arguments(package, tiny_inputs), skip=SKIP, pending_limit=1).run()
        failed = first_failure(results)
        config_map = next(m for m in platform.manifests if m["kind"] == "ConfigMap")["metadata"]["name"]
        expected = f'secret "{S3_SECRET}" not found' if missing == "secret" else f'configmap "{config_map}" not found'
        assert "CreateContainerConfigError" in failed.error and expected in failed.error
        assert all(name not in results or results[name].state != "SUCCEEDED" for name in TRAINING)
        assert created_jobs(platform.cluster) == []
        assert platform.cluster.api.calls("create", TRAINJOB.resource) == []


def test_secret_outside_the_allow_list_fails_before_any_job(sandbox, object_store, tracking_server, tiny_inputs,
                                                            packages, cache, tmp_path):
    with deployment(tmp_path, packages, object_store, tracking_uri=tracking_server) as platform:
        platform.cluster.create_namespace_objects(NAMESPACE, secrets_={"team-b-s3": {"AWS_ACCESS_KEY_ID": "b"}})
        package = platform.package("rlhf-dpo")
        arguments = tiny_arguments(package, tiny_inputs, s3_secret="team-b-s3")
        results = platform.run("rlhf-dpo", arguments, skip=SKIP, cache=cache).run()
        assert results["train-sft"].state == "FAILED"
        assert "team-b-s3" in results["train-sft"].log
        assert created_jobs(platform.cluster) == []


def test_unschedulable_job_is_reported_and_cancelling_the_run_deletes_it(sandbox, object_store, tracking_server,
                                                                        tiny_inputs, packages, cache, tmp_path):
    kind = TRAINJOB
    with deployment(tmp_path, packages, object_store, tracking_uri=tracking_server, kind=kind.name) as platform:
        cluster = platform.cluster
        package = platform.package("rlhf-dpo")
        # Two GPUs per node: the GPU node has one, the CPU node is not selected.
        run = platform.run("rlhf-dpo", tiny_arguments(package, tiny_inputs, gpus_per_node=2), skip=SKIP,
                           cache=cache).start()
        run.wait_for(lambda: kind.created(cluster), 240, "the SFT job is created")
        created = time.monotonic()
        run.wait_for(lambda: "Insufficient nvidia.com/gpu" in run.pod_log("train-sft"), 60,
                     "the component reports why the job's pod is Pending")
        assert time.monotonic() - created < 60
        log = run.pod_log("train-sft")
        assert "didn't match Pod's node affinity/selector" in log  # the scheduler's full message
        run.cancel()
        results = run.join(timeout=60)
        assert results["train-sft"].state == "FAILED"
        cluster.wait_for(lambda: kind.jobs(cluster) == [], 30, "the cancelled run's job is deleted")
        assert cluster.api.calls("delete", kind.resource), "the component deleted its job when it was stopped"


# A PyTorchJob's pending pods are reported by the same launcher code (pods.py), tested against the Kubernetes
# stand-in (tests/components/launcher/follow/test_pending_pods.py); its run here is `slow`, to keep the suite in budget.
@pytest.mark.parametrize("kind", [KINDS["trainjob"], pytest.param(KINDS["pytorchjob"], marks=pytest.mark.slow)],
                         ids=["trainjob", "pytorchjob"])
def test_pending_limit_from_the_charts_configmap_fails_the_task_with_the_pending_reason(
        kind, sandbox, object_store, tracking_server, tiny_inputs, packages, cache, tmp_path):
    values = chart_values(object_store, tracking_server, kind.name)
    values["scheduling"]["pendingTimeoutSeconds"] = 2  # rendered as ALIGNFLOW_PENDING_TIMEOUT_SECONDS
    with deployment(tmp_path, packages, object_store, values=values, kind=kind.name) as platform:
        cluster = platform.cluster
        config_map = next(m for m in platform.manifests if m["kind"] == "ConfigMap")
        assert config_map["data"]["ALIGNFLOW_PENDING_TIMEOUT_SECONDS"] == "2"
        package = platform.package("rlhf-dpo")
        # Two GPUs per node: the GPU node has one, so the SFT pod stays Pending.
        run = platform.run("rlhf-dpo", tiny_arguments(package, tiny_inputs, gpus_per_node=2), skip=SKIP,
                           cache=cache).start()
        run.wait_for(lambda: kind.created(cluster), 240, "the SFT job is created")
        created = time.monotonic()
        results = run.join(timeout=120)
        sft = results["train-sft"]
        assert sft.state == "FAILED"
        assert time.monotonic() - created < 60, "the task outlived the ConfigMap's pending limit by far"
        assert "(pending limit 2 s)" in sft.log and "Insufficient nvidia.com/gpu" in sft.log
        assert results["train-dpo"].state != "SUCCEEDED"
        cluster.wait_for(lambda: kind.jobs(cluster) == [], 30, "the stuck job is deleted")


def test_job_deleted_from_outside_fails_its_task_at_once(sandbox, object_store, tracking_server, tiny_inputs,
                                                         packages, cache, tmp_path):
    from kubernetes import client

    from tests.cluster.apiserver import RESOURCES

    kind = TRAINJOB

    with deployment(tmp_path, packages, object_store, tracking_uri=tracking_server, kind=kind.name) as platform:
        cluster = platform.cluster
        package = platform.package("rlhf-dpo")
        long_sft = {**tiny_arguments(package, tiny_inputs)["sft_settings"], "train.max_steps": 100000}
        run = platform.run("rlhf-dpo", tiny_arguments(package, tiny_inputs, sft_epochs=1000, sft_settings=long_sft),
                           skip=SKIP, cache=cache).start()
        run.wait_for(kind.running(cluster, "sft"), 240, "the SFT job runs")
        [job] = kind.jobs(cluster)
        group, _, _, version = RESOURCES[kind.resource]
        client.CustomObjectsApi(cluster.client()).delete_namespaced_custom_object(
            group, version, NAMESPACE, kind.resource, job["metadata"]["name"])  # kubectl delete trainjob/pytorchjob
        deleted = time.monotonic()
        results = run.join(timeout=120)
        assert results["train-sft"].state == "FAILED"
        assert time.monotonic() - deleted < 45, "the task noticed the deletion late"
        assert "deleted" in results["train-sft"].log.lower()
        assert results["train-dpo"].state != "SUCCEEDED"


@pytest.mark.slow
def test_component_killed_mid_job_is_retried_and_reattaches_to_the_running_job(sandbox, object_store, tracking_server,
                                                                              tiny_inputs, packages, tmp_path):
    with deployment(tmp_path, packages, object_store, tracking_uri=tracking_server) as platform:
        cluster = platform.cluster
        package = platform.package("rlhf-dpo")
        run = platform.run("rlhf-dpo", tiny_arguments(package, tiny_inputs), skip=SKIP | {"train-dpo"},
                           retries=True).start()
        run.wait_for(lambda: created_jobs(cluster), 240, "the SFT job is created")
        first_pod = run.current_pod
        os.killpg(cluster.kubelet.runtime((NAMESPACE, first_pod)).process.pid, signal.SIGKILL)  # OOM-killed
        results = run.join(timeout=300)
        sft = results["train-sft"]
        assert (sft.state, sft.attempts) == ("SUCCEEDED", 2) and sft.pod != first_pod
        assert [job["metadata"]["labels"]["alignflow/stage"] for job in created_jobs(cluster)] == ["sft"]
        assert "re-attach" in sft.log  # the retry followed the job its first attempt created


@pytest.mark.slow
def test_prepared_inputs_are_cached_on_their_content_not_their_uri(sandbox, object_store, tracking_server, tiny_inputs,
                                                                  packages, tmp_path):
    from tests.cluster.kfp_runner import ObjectStore
    from tests.integration.services import S3_ENV

    store, uri = ObjectStore(object_store, S3_ENV), tiny_inputs["sft_train_uri"]
    original = tmp_path / "sft_train.jsonl"
    store.download(uri, original)
    cache = ExecutionCache()
    with deployment(tmp_path / "cluster", packages, object_store, tracking_uri=tracking_server) as platform:
        package = platform.package("rlhf-dpo")
        tasks = kfp_ir.load_package(package)[0]["components"]["comp-exit-handler-1"]["dag"]["tasks"]
        skip = set(tasks) - {"fingerprint-inputs", "prepare-inputs"}

        def prepared_rows() -> list[str]:
            results = platform.run("rlhf-dpo", tiny_arguments(package, tiny_inputs), skip=skip, cache=cache).run()
            assert results["prepare-inputs"].state == "SUCCEEDED"
            store.download(results["prepare-inputs"].artifacts["sft_train"][0]["uri"], tmp_path / "copy.jsonl")
            return (tmp_path / "copy.jsonl").read_text().splitlines()

        try:
            first = prepared_rows()
            assert prepared_rows() == first and cache.hits == ["prepare-inputs"]  # unchanged data: a cache hit
            changed = original.read_text() + '{"prompt": "1+1=", "completion": "2"}\n'
            (tmp_path / "changed.jsonl").write_text(changed)
            store.upload(tmp_path / "changed.jsonl", uri)  # new data at the same URI (a weekly `latest`)
            assert prepared_rows() == changed.splitlines() and cache.hits == ["prepare-inputs"]
        finally:
            store.upload(original, uri)


def test_unreachable_s3_endpoint_is_named(sandbox, object_store, tracking_server, tiny_inputs, packages, tmp_path):
    unreachable = f"http://127.0.0.1:{free_port()}"
    values = chart_values(unreachable, tracking_server)
    # An outage is retried for s3.retrySeconds (ALIGNFLOW_S3_RETRY_SECONDS in the ConfigMap); 300 s by default.
    values["s3"]["retrySeconds"] = 1
    with deployment(tmp_path, packages, object_store, values=values) as platform:
        package = platform.package("rlhf-dpo")
        started = time.monotonic()
        results = platform.run("rlhf-dpo", tiny_arguments(package, tiny_inputs), skip=SKIP, task_timeout=120).run()
        failed = first_failure(results)
        assert unreachable in failed.log and "ALIGNFLOW_S3_RETRY_SECONDS is 1" in failed.log
        assert time.monotonic() - started < 90, "the outage was retried past the ConfigMap's budget"
        assert created_jobs(platform.cluster) == []
