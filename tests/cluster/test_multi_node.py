"""A 2-node elastic SFT job on the emulated cluster loses a worker mid-training and still finishes.

The job is the launcher's own: `stage_manifest` builds it from `ClusterOptions(num_nodes=2)` (two
Worker replicas, one process each, an `elasticPolicy` with the c10d rendezvous) and
`KubernetesLauncher.run` creates and follows it through the emulated API, as a stage component
does. Each replica is a sandboxed process with its pod's hostname, reaching the others by their
Service names; the operator injects PET_RDZV_ENDPOINT (worker-0). Nothing passes between the pods
but the object store: config, tiny model, data, checkpoints, metrics and the exported model.

Once a checkpoint is complete, worker-1's container is SIGKILLed (a node loss, an OOM kill). The
kubelet restarts it in the same pod (`restartPolicy: OnFailure`, after a 1 s back-off), its agent
rejoins the rendezvous, worker-0's agent restarts its own worker in the new round (within
`maxRestarts`), both resume from the newest checkpoint, and the job Succeeds within its
`backoffLimit`. About 25 s on 2 cores.
"""

from __future__ import annotations

import json
import re
import threading
import uuid

from tests.cluster.cluster import Cluster
from tests.cluster.conftest import DATA_BUCKET, IMAGE_USERS, NAMESPACE, S3_SECRET, emulated_nodes
from tests.cluster.kfp_runner import ObjectStore
from tests.integration.services import S3_ENV

MAX_STEPS = 120  # about 0.03 s a step here (one thread per rank): the kill lands seconds before the end
SAVE_INTERVAL = 10
STEP_LINE = re.compile(r"step (\d+)/\d+ loss")
# torchrun's c10d rendezvous (read from PET_RDZV_CONF, as a job's env sets it): the killed agent's place in the
# rendezvous is freed once it has missed keep_alive_max_attempt heartbeats, keep_alive_interval apart (5 s x 3 by
# default, all of which the rejoin would wait); here 1 s x 3.
RDZV_CONF = "keep_alive_interval=1,keep_alive_max_attempt=3"


def sft_config(inputs: dict[str, str], job_root: str, model_uri: str) -> dict:
    """A few steps of SFT on the tiny task (2 ranks x 4 samples a step), a checkpoint every SAVE_INTERVAL steps."""
    return {"model": {"path": inputs["base_model_uri"]},
            "data": {"train_path": inputs["sft_train_uri"], "eval_path": None, "max_length": 32},
            "optimizer": {"lr": 2e-3, "warmup_steps": 2},
            # One torch thread per rank: both "nodes" share this machine's CPUs, where each would have its own; two
            # threads per rank on 2 cores oversubscribe them and make each step 20-30 times slower.
            "train": {"max_epochs": 20, "max_steps": MAX_STEPS, "micro_batch_size": 4, "log_interval": 1,
                      "num_threads": 1},
            "checkpoint": {"save_interval": SAVE_INTERVAL, "keep_last": 0},
            "tracking": {"backend": "none"},
            "output_dir": job_root, "export_dir": model_uri}


def read_text(store: ObjectStore, uri: str) -> str:
    bucket, key = store.split(uri)
    return store.client.get_object(Bucket=bucket, Key=key)["Body"].read().decode()


def test_two_node_elastic_job_survives_a_killed_worker(sandbox, object_store, tiny_inputs, tmp_path):
    import yaml
    from transformers import AutoModelForCausalLM

    from components.launcher.kubernetes import KubernetesLauncher
    from components.launcher.stage_job import ClusterOptions, stage_manifest
    from tests.cluster.training_operator import condition_true

    store = ObjectStore(object_store, S3_ENV)
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    job_root = f"s3://{DATA_BUCKET}/{run_id}/alignflow-jobs/sft"
    model_uri = f"s3://{DATA_BUCKET}/{run_id}/model"
    config = sft_config(tiny_inputs, job_root, model_uri)
    config_uri = f"{job_root}/sft.yaml"
    store.client.put_object(Bucket=DATA_BUCKET, Key=store.split(config_uri)[1], Body=yaml.safe_dump(config).encode())
    options = ClusterOptions(mode="kubernetes", image="ghcr.io/alignflow/trainer:test", namespace=NAMESPACE,
                             num_nodes=2, nproc_per_node=1, s3_secret=S3_SECRET, poll_seconds=1.0,
                             env={"AWS_ENDPOINT_URL": object_store, "AWS_DEFAULT_REGION": "us-east-1",
                                  "OMP_NUM_THREADS": "1", "PET_RDZV_CONF": RDZV_CONF})
    manifest = stage_manifest("sft", config_uri, run_id, "sft", options, config=config)
    name = manifest["metadata"]["name"]
    assert set(manifest["spec"]["pytorchReplicaSpecs"]) == {"Worker"} and manifest["spec"]["elasticPolicy"]

    with Cluster(tmp_path, emulated_nodes(), image_users=IMAGE_USERS) as cluster:
        cluster.create_namespace_objects(NAMESPACE, secrets_={S3_SECRET: {
            "AWS_ACCESS_KEY_ID": S3_ENV["AWS_ACCESS_KEY_ID"], "AWS_SECRET_ACCESS_KEY": S3_ENV["AWS_SECRET_ACCESS_KEY"]}})
        launcher = KubernetesLauncher(cluster.client(), poll_seconds=1.0)
        outcome: dict = {}

        def launch() -> None:
            try:
                outcome["result"] = launcher.run(manifest, timeout=240, keep_job=True)
            except Exception as err:  # reported by the assertion below
                outcome["error"] = err

        thread = threading.Thread(target=launch, daemon=True)
        thread.start()
        worker_0, worker_1 = (NAMESPACE, f"{name}-worker-0"), (NAMESPACE, f"{name}-worker-1")

        def logged_steps(key: tuple[str, str]) -> list[int]:
            runtime = cluster.kubelet.runtime(key)
            return [int(m.group(1)) for m in STEP_LINE.finditer(runtime.log.text)] if runtime else []

        def log(key: tuple[str, str]) -> str:
            runtime = cluster.kubelet.runtime(key)
            return runtime.log.text[-4000:] if runtime else "(no log)"

        # A complete checkpoint and a step beyond it: then worker-1's container dies with SIGKILL.
        try:
            cluster.wait_for(lambda: "saved checkpoint" in log(worker_0)
                             and max(logged_steps(worker_0), default=0) > SAVE_INTERVAL, 180,
                             "a checkpoint is complete and training goes on")
        except TimeoutError:
            raise AssertionError(f"worker-0:\n{log(worker_0)}\nworker-1:\n{log(worker_1)}") from None
        cluster.kubelet.kill_container(*worker_1)
        killed_at = max(logged_steps(worker_0))
        assert killed_at < MAX_STEPS, "training ended before the worker could be killed"

        thread.join(timeout=300)
        assert not thread.is_alive(), "the launcher did not return"
        assert "error" not in outcome, f"{outcome.get('error')}\nworker-0:\n{log(worker_0)}\nworker-1:\n{log(worker_1)}"
        job = next(j for j in cluster.jobs(NAMESPACE) if j["metadata"]["name"] == name)
        assert condition_true(job, "Succeeded") and outcome["result"].phase == "Succeeded"
        # Worker-1's pod as the API showed it (the emulator stops pods still running when the job ends): the same
        # pod ran a second container, the first one's end on record as SIGKILL (137, as a container runtime says).
        statuses = [status for event in cluster.store.history
                    if event.resource == "pods" and event.object["metadata"]["name"] == worker_1[1]
                    for status in event.object["status"].get("containerStatuses", [])]
        assert any(status["restartCount"] >= 1 and "running" in status["state"]
                   and status["lastState"]["terminated"]["exitCode"] == 137 for status in statuses), statuses[-3:]
        worker_0_log, worker_1_log = (cluster.kubelet.runtime(key).log.text for key in (worker_0, worker_1))

    # The new worker group (a second rendezvous round) resumed once, from a checkpoint written before the end.
    resumed = [int(step) for step in re.findall(r"resumed from \S+ \(.*\bglobal_step (\d+)", worker_0_log)]
    assert len(resumed) == 1 and SAVE_INTERVAL <= resumed[0] < MAX_STEPS, worker_0_log[-4000:]
    assert worker_1_log.count("Loading weights: 100%") >= 2  # both of worker-1's containers ran rank 1
    # Each step logged once, 1..MAX_STEPS: the history continued from the checkpoint, nothing replayed twice.
    records = [json.loads(line) for line in read_text(store, f"{job_root}/metrics.jsonl").splitlines() if line]
    assert [r["step"] for r in records if "loss" in r] == list(range(1, MAX_STEPS + 1))
    final = json.loads(read_text(store, f"{job_root}/final_metrics.json"))
    assert final["global_step"] == MAX_STEPS, final
    store.download(model_uri, tmp_path / "model")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "model")
    assert model.num_parameters() > 0
