"""A 2-node SFT job on the emulated cluster loses a node mid-training (and a TrainJob is then preempted) and finishes.

Run for both kinds, each built and followed by the launcher as a stage component does
(`stage_spec`, the kind's `build`, `KubernetesLauncher.run`):

- a PyTorchJob: two Worker replicas with an `elasticPolicy` (c10d rendezvous hosted by worker-0);
- a TrainJob on the chart's TrainingRuntime, created through the Kubeflow SDK: two `node` pods of an
  Indexed Job, torchrun's static rendezvous on node 0 (`PET_MASTER_ADDR`).

Each pod is a sandboxed process with its own hostname, reaching the others by name; nothing passes
between the pods but the object store: config, tiny model, data, checkpoints, metrics and the model.

Once a checkpoint is complete, rank 1's container is SIGKILLed (a lost node, an OOM kill): the
PyTorchJob's kubelet restarts it in the same pod and its agent rejoins the rendezvous (within
`maxRestarts` and `backoffLimit`); the TrainJob's Job fails (exit 137, backoffLimit 0) and JobSet
restarts both nodes, which counts against the runtime's `maxRestarts`. The TrainJob is then preempted
once training has gone on past a newer checkpoint: rank 1's pod is evicted (DisruptionTarget,
SIGTERM), the trainer stops at a step boundary with a checkpoint and exits 143, and the runtime's
failure policy restarts both nodes without counting it. (A PyTorchJob's evicted replica is recreated
by the operator: tests/cluster/test_emulated_cluster.py, in seconds.) Every rank resumes from the
newest checkpoint each time: each step is logged once, and the job succeeds with its model in S3.
About 30 s (PyTorchJob) and 45 s (TrainJob) on 2 cores.
"""

from __future__ import annotations

import json
import re
import threading
import uuid

import pytest

from tests.cluster.cluster import Cluster
from tests.cluster.conftest import (
    DATA_BUCKET,
    IMAGE_USERS,
    KINDS,
    NAMESPACE,
    S3_SECRET,
    chart_values,
    emulated_nodes,
    render_chart,
)
from tests.cluster.kfp_runner import ObjectStore
from tests.integration.services import S3_ENV

MAX_STEPS = 160  # about 0.03 s a step here (one thread per rank): the interruptions land before the end
SAVE_INTERVAL = 10
STEP_LINE = re.compile(r"step (\d+)/\d+ loss")
# torchrun's c10d rendezvous (read from PET_RDZV_CONF, as a job's env sets it): the killed agent's place in the
# rendezvous is freed once it has missed keep_alive_max_attempt heartbeats, keep_alive_interval apart (5 s x 3 by
# default, all of which the rejoin would wait); here 1 s x 3. A TrainJob's static rendezvous does not read it.
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


class Nodes:
    """The job's two pods as the test sees them: rank 0 and rank 1, whichever pod plays each now."""

    def __init__(self, cluster: Cluster, kind, name: str) -> None:
        self.cluster, self.kind, self.name = cluster, kind, name
        self.logs: dict[str, str] = {}  # pod -> log, kept after the pod is gone

    def pod(self, rank: int) -> str | None:
        """The newest pod of `rank` (a PyTorchJob's worker-<rank>; a TrainJob's completion index <rank>)."""
        if self.kind.name == "pytorchjob":
            return f"{self.name}-worker-{rank}"
        pods = [p for p in self.kind.pods(self.cluster, self.name)
                if p["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"] == str(rank)
                and not p["metadata"].get("deletionTimestamp")]
        return max(pods, key=lambda p: int(p["metadata"]["labels"]["jobset.sigs.k8s.io/restart-attempt"]),
                   default={"metadata": {"name": None}})["metadata"]["name"]

    def log(self, rank: int) -> str:
        pod = self.pod(rank)
        runtime = self.cluster.kubelet.runtime((NAMESPACE, pod)) if pod else None
        if runtime is not None:
            self.logs[pod] = runtime.log.text
        return self.logs.get(pod, "(no log)")

    def steps(self, rank: int) -> list[int]:
        return [int(m.group(1)) for m in STEP_LINE.finditer(self.log(rank))]

    def all_logs(self) -> str:
        for key, runtime in {**self.cluster.kubelet.removed, **self.cluster.kubelet.runtimes}.items():
            self.logs[key[1]] = runtime.log.text
        return "\n".join(text for pod, text in sorted(self.logs.items()) if pod.startswith(self.name))


def launch_stage(cluster: Cluster, kind, options, config: dict, config_uri: str, run_id: str):
    """What a stage component does on Kubernetes, for `kind`; returns (job name, thread, outcome)."""
    from components.launcher.follow.launcher import KubernetesLauncher
    from components.launcher.stage_job import stage_spec

    spec = stage_spec("sft", config_uri, run_id, "sft", options, config=config)
    api_client = cluster.client()
    if kind.name == "trainjob":
        from components.launcher.kinds.trainjob.kind import TrainJobKind

        job_kind = TrainJobKind(api_client, NAMESPACE, options.trainer_runtime)
    else:
        from components.launcher.kinds.pytorchjob.kind import PyTorchJobKind

        job_kind = PyTorchJobKind(api_client)
    request = job_kind.build(spec)
    launcher = KubernetesLauncher(api_client, kind=job_kind, poll_seconds=1.0)
    outcome: dict = {}

    def launch() -> None:
        try:
            outcome["result"] = launcher.run(request, timeout=300, keep_job=True)
        except Exception as err:  # reported by the assertion below
            outcome["error"] = err

    thread = threading.Thread(target=launch, daemon=True)
    thread.start()
    return spec.name, thread, outcome


@pytest.mark.parametrize("kind", [KINDS["trainjob"], KINDS["pytorchjob"]], ids=["trainjob", "pytorchjob"])
def test_two_node_job_survives_a_lost_node_and_a_trainjob_a_preemption(kind, sandbox, object_store, tiny_inputs, tmp_path):
    from transformers import AutoModelForCausalLM

    from components.launcher.stage_job import ClusterOptions
    from tests.cluster.training_operator import condition_true

    store = ObjectStore(object_store, S3_ENV)
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    job_root = f"s3://{DATA_BUCKET}/{run_id}/alignflow-jobs/sft"
    model_uri = f"s3://{DATA_BUCKET}/{run_id}/model"
    config = sft_config(tiny_inputs, job_root, model_uri)
    config_uri = f"{job_root}/sft.yaml"
    import yaml

    store.client.put_object(Bucket=DATA_BUCKET, Key=store.split(config_uri)[1], Body=yaml.safe_dump(config).encode())
    options = ClusterOptions(mode="kubernetes", image="ghcr.io/alignflow/trainer:test", namespace=NAMESPACE,
                             num_nodes=2, nproc_per_node=1, s3_secret=S3_SECRET, poll_seconds=1.0,
                             trainer_runtime="af-alignflow-torch",
                             env={"AWS_ENDPOINT_URL": object_store, "AWS_DEFAULT_REGION": "us-east-1",
                                  "OMP_NUM_THREADS": "1", "PET_RDZV_CONF": RDZV_CONF})

    with Cluster(tmp_path, emulated_nodes(), image_users=IMAGE_USERS, serves=kind.serves) as cluster:
        cluster.create_namespace_objects(NAMESPACE, secrets_={S3_SECRET: {
            "AWS_ACCESS_KEY_ID": S3_ENV["AWS_ACCESS_KEY_ID"], "AWS_SECRET_ACCESS_KEY": S3_ENV["AWS_SECRET_ACCESS_KEY"]}})
        for manifest in render_chart(chart_values(object_store, kind=kind.name), cluster.api_versions()):
            if manifest["kind"] == "TrainingRuntime":  # the chart's, as installed on a Kubeflow Trainer cluster
                cluster.apply(manifest, NAMESPACE)
        name, thread, outcome = launch_stage(cluster, kind, options, config, config_uri, run_id)
        nodes = Nodes(cluster, kind, name)

        def checkpoint_beyond(step: int):
            return lambda: max(nodes.steps(0), default=0) > step + SAVE_INTERVAL and "saved checkpoint" in nodes.log(0)

        try:  # A complete checkpoint and a step beyond it: then rank 1's container dies with SIGKILL.
            cluster.wait_for(checkpoint_beyond(0), 180, "a checkpoint is complete and training goes on")
            killed = (NAMESPACE, nodes.pod(1))
            cluster.kubelet.kill_container(*killed)
            killed_at = evicted_at = max(nodes.steps(0))
            if kind.name == "trainjob":  # resumed past a newer checkpoint: rank 1's pod is evicted (SIGTERM, 143)
                cluster.wait_for(lambda: "resumed from" in nodes.log(0) and checkpoint_beyond(killed_at)(), 180,
                                 "training resumed past a newer checkpoint")
                evicted = nodes.pod(1)
                cluster.evict(NAMESPACE, evicted)
                evicted_at = max(nodes.steps(0))
        except TimeoutError:
            raise AssertionError(nodes.all_logs()[-6000:]) from None
        assert evicted_at < MAX_STEPS, "training ended before the pod could be evicted"
        thread.join(timeout=300)
        assert not thread.is_alive(), "the launcher did not return"
        assert "error" not in outcome, f"{outcome.get('error')}\n{nodes.all_logs()[-6000:]}"
        [job] = kind.jobs(cluster)
        assert condition_true(job, "Complete" if kind.name == "trainjob" else "Succeeded")
        assert outcome["result"].phase == "Succeeded"
        statuses = {pod: [s for e in cluster.store.history if e.resource == "pods" and e.object["metadata"]["name"] == pod
                          for s in e.object["status"].get("containerStatuses", [])] for pod in (killed[1],)}
        if kind.name == "trainjob":
            # The lost node failed its Job (SIGKILL: 137) and JobSet restarted both nodes, counted; the evicted one
            # stopped with a checkpoint (143) and both restarted again, not counted against maxRestarts.
            assert any(s["state"].get("terminated", {}).get("exitCode") == 137 for s in statuses[killed[1]])
            assert cluster.trainer.jobsets[job["metadata"]["uid"]].restarts == 1
            assert cluster.trainer.jobsets[job["metadata"]["uid"]].attempt == 2
            # The evicted pod's trainer stopped with its checkpoint and exited 143 (not torchrun's 1, not a SIGKILL).
            runtime = cluster.kubelet.removed[(NAMESPACE, evicted)]
            assert runtime.process.returncode == 143, runtime.log.text[-3000:]
        else:
            # The same pod ran a second container after the SIGKILL (137, as a container runtime says).
            assert any(s["restartCount"] >= 1 and s["lastState"]["terminated"]["exitCode"] == 137
                       for s in statuses[killed[1]] if "lastState" in s)
        logs = nodes.all_logs()

    # Each interruption was followed by one resume from a checkpoint written before the end.
    resumed = [int(step) for step in re.findall(r"resumed from \S+ \(.*\bglobal_step (\d+)", logs)]
    interruptions = 2 if kind.name == "trainjob" else 1
    assert len(set(resumed)) == interruptions and all(SAVE_INTERVAL <= step < MAX_STEPS for step in resumed), \
        logs[-4000:]
    # Each step logged once, 1..MAX_STEPS: the history continued from the checkpoints, nothing replayed twice.
    records = [json.loads(line) for line in read_text(store, f"{job_root}/metrics.jsonl").splitlines() if line]
    assert [r["step"] for r in records if "loss" in r] == list(range(1, MAX_STEPS + 1))
    final = json.loads(read_text(store, f"{job_root}/final_metrics.json"))
    assert final["global_step"] == MAX_STEPS, final
    store.download(model_uri, tmp_path / "model")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "model")
    assert model.num_parameters() > 0
