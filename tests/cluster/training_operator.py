"""The Training Operator's PyTorchJob controller, emulated: pods from replica specs, env, conditions.

For each PyTorchJob it creates one pod per replica (`<job>-master-0`, `<job>-worker-<i>`, labelled
and owned like the operator's), with the environment the operator (v1.9) appends to every
container: PYTHONUNBUFFERED, MASTER_ADDR/PORT and PET_MASTER_ADDR/PORT, WORLD_SIZE, RANK,
PET_NPROC_PER_NODE, PET_NODE_RANK, and PET_NNODES, or with an `elasticPolicy` the PET_RDZV_* set.
Service names of the replicas resolve through each pod's /etc/hosts to a loopback address of the
replica's own (127.0.0.2, .3, ...: every 127/8 address is this machine), so, as between real pods,
no replica takes another's name for its own (torchrun's c10d rendezvous hosts its store on the
agent whose host matches the endpoint). It then follows the pods and sets the job's conditions as
the operator does: Created; Running once the master runs (with no Master replica: once a worker
runs); Succeeded when the master succeeds (with no Master: when every worker has, or, for an
elastic job, when one has); Failed when a replica fails for good, when the container restarts of
the running pods reach `runPolicy.backoffLimit` (any restart when it is 0), or when
`activeDeadlineSeconds` passes; Restarting (and a new pod) for `restartPolicy: ExitCode` on a
retryable exit code. A pod whose container fails under `restartPolicy: OnFailure` is restarted
in place by the kubelet (kubelet.py), so a restarted worker of an elastic job rejoins its
rendezvous under the same name. When the job is deleted, its pods
go too (garbage collection of owned objects); `ttlSecondsAfterFinished` deletes finished jobs.

One difference is forced by sharing the host network: each job's ports are mapped to free ports
of this machine (the env carries the mapped port), since every pod here listens on the same
loopback. Pods still running when a job finishes are stopped, whatever `cleanPodPolicy` says.
"""

from __future__ import annotations

import datetime
import socket

from tests.cluster.kubelet import Kubelet
from tests.cluster.store import Store, now_rfc3339

DEFAULT_PORT = 23456
PORT_NAME = "pytorchjob-port"
LABEL = "training.kubeflow.org"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def replica_name(job: str, replica_type: str, index: int) -> str:
    return f"{job}-{replica_type.lower()}-{index}"


def _seconds_since(stamp: str) -> float:
    then = datetime.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.timezone.utc)
    return (datetime.datetime.now(datetime.timezone.utc) - then).total_seconds()


def condition_true(job: dict, kind: str) -> bool:
    return any(c["type"] == kind and c["status"] == "True" for c in (job.get("status") or {}).get("conditions", []))


class TrainingOperator:
    def __init__(self, store: Store, kubelet: Kubelet) -> None:
        self.store = store
        self.kubelet = kubelet
        self.ports: dict[str, dict[str, int]] = {}  # job uid -> replica type -> host port

    def sync(self) -> None:
        jobs, _ = self.store.list("pytorchjobs")
        for job in jobs:
            self._reconcile(job)
        uids = {job["metadata"]["uid"] for job in jobs}
        pods, _ = self.store.list("pods")
        for pod in pods:  # garbage collection of the pods of deleted jobs
            owners = [o for o in pod["metadata"].get("ownerReferences", []) if o["kind"] == "PyTorchJob"]
            if owners and owners[0]["uid"] not in uids and not pod["metadata"].get("deletionTimestamp"):
                self._delete_pod(pod)

    # ---- pods

    def _port(self, job: dict, replica_type: str) -> int:
        ports = self.ports.setdefault(job["metadata"]["uid"], {})
        if replica_type not in ports:
            ports[replica_type] = free_port()
        return ports[replica_type]

    def _env(self, job: dict, replica_type: str, index: int) -> list[dict]:
        name, spec = job["metadata"]["name"], job["spec"]
        replicas = spec["pytorchReplicaSpecs"]
        total = sum(int(r.get("replicas", 1)) for r in replicas.values())
        nproc = str(spec.get("nprocPerNode") or "auto")
        env = [{"name": "PYTHONUNBUFFERED", "value": "0"}]
        if "Master" in replicas:
            port, address = str(self._port(job, "Master")), replica_name(name, "Master", 0)
            rank = index + 1 if replica_type == "Worker" else index
            env += [{"name": "MASTER_PORT", "value": port}, {"name": "PET_MASTER_PORT", "value": port},
                    {"name": "MASTER_ADDR", "value": address}, {"name": "PET_MASTER_ADDR", "value": address},
                    {"name": "WORLD_SIZE", "value": str(total * (int(nproc) if nproc.isdigit() else 1))},
                    {"name": "RANK", "value": str(rank)}, {"name": "PET_NPROC_PER_NODE", "value": nproc},
                    {"name": "PET_NODE_RANK", "value": str(rank)}]
        elastic = spec.get("elasticPolicy")
        if elastic is None:
            return env + [{"name": "PET_NNODES", "value": str(total)}]
        host = elastic.get("rdzvHost") or replica_name(name, "Worker", 0)
        port = elastic.get("rdzvPort") or self._port(job, "Worker")
        nodes = (f"{elastic['minReplicas']}:{elastic['maxReplicas']}" if "minReplicas" in elastic
                 else str(replicas.get("Worker", {}).get("replicas", 0)))
        env += [{"name": "PET_RDZV_ENDPOINT", "value": f"{host}:{port}"},
                {"name": "PET_RDZV_BACKEND", "value": elastic.get("rdzvBackend", "c10d")},
                {"name": "PET_NNODES", "value": nodes}]
        optional = {"maxRestarts": "PET_MAX_RESTARTS", "nProcPerNode": "PET_NPROC_PER_NODE", "rdzvId": "PET_RDZV_ID"}
        env += [{"name": var, "value": str(elastic[key])} for key, var in optional.items() if key in elastic]
        if elastic.get("rdzvConf"):
            env.append({"name": "PET_RDZV_CONF", "value": ",".join(f"{c['key']}={c['value']}"
                                                                    for c in elastic["rdzvConf"])})
        return env

    def _create_pod(self, job: dict, replica_type: str, index: int) -> None:
        meta, replica = job["metadata"], job["spec"]["pytorchReplicaSpecs"][replica_type]
        template = replica.get("template", {})
        labels = {**(template.get("metadata", {}).get("labels") or {}), f"{LABEL}/job-name": meta["name"],
                  f"{LABEL}/replica-type": replica_type.lower(), f"{LABEL}/replica-index": str(index),
                  f"{LABEL}/operator-name": "pytorchjob-controller"}
        if replica_type == "Master":
            labels[f"{LABEL}/job-role"] = "master"
        spec = dict(template.get("spec", {}))
        policy = replica.get("restartPolicy", "Never")
        spec["restartPolicy"] = "Never" if policy == "ExitCode" else policy
        env = self._env(job, replica_type, index)
        spec["containers"] = [{**c, "env": [*(c.get("env") or []), *env]} for c in spec.get("containers", [])]
        name = replica_name(meta["name"], replica_type, index)
        replicas = [replica_name(meta["name"], kind, i) for kind, r in job["spec"]["pytorchReplicaSpecs"].items()
                    for i in range(int(r.get("replicas", 1)))]
        hosts = {replica: f"127.0.0.{2 + number}" for number, replica in enumerate(replicas)}
        self.kubelet.hosts[(meta["namespace"], name)] = hosts
        self.store.create("pods", {
            "metadata": {"name": name, "namespace": meta["namespace"], "labels": labels,
                         "annotations": template.get("metadata", {}).get("annotations") or {},
                         "ownerReferences": [{"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": meta["name"],
                                              "uid": meta["uid"], "controller": True, "blockOwnerDeletion": True}]},
            "spec": spec, "status": {"phase": "Pending"}})

    def _delete_pod(self, pod: dict) -> None:
        self.store.mutate("pods", pod["metadata"]["namespace"], pod["metadata"]["name"],
                          lambda p: p["metadata"].setdefault("deletionTimestamp", now_rfc3339()))

    # ---- the job

    def _reconcile(self, job: dict) -> None:
        meta, spec = job["metadata"], job["spec"]
        namespace, name = meta["namespace"], meta["name"]
        run_policy = spec.get("runPolicy") or {}
        pods = {p["metadata"]["name"]: p for p in self.store.list(
            "pods", namespace, f"{LABEL}/job-name={name}")[0]
            if p["metadata"]["ownerReferences"][0]["uid"] == meta["uid"]}
        if condition_true(job, "Succeeded") or condition_true(job, "Failed"):
            self._finished(job, pods, run_policy)
            return
        updates: list[tuple[str, str, str]] = []
        if not (job.get("status") or {}).get("conditions"):
            updates.append(("Created", "PyTorchJobCreated", f"PyTorchJob {namespace}/{name} is created."))
        for replica_type, replica in spec["pytorchReplicaSpecs"].items():
            for index in range(int(replica.get("replicas", 1))):
                pod = pods.get(replica_name(name, replica_type, index))
                if pod is None:
                    self._create_pod(job, replica_type, index)
                elif pod["status"].get("phase") == "Failed" and replica.get("restartPolicy") == "ExitCode" \
                        and self._retryable(pod):
                    self._delete_pod(pod)
                    updates.append(("Restarting", "PyTorchJobRestarting",
                                    f"PyTorchJob {name} is restarting because 1 {replica_type} replica(s) failed."))
        updates += self._outcome(job, pods, run_policy)
        if updates:
            self._set_conditions(namespace, name, updates)

    @staticmethod
    def _retryable(pod: dict) -> bool:
        state = pod["status"]["containerStatuses"][0]["state"].get("terminated", {})
        return state.get("exitCode", 0) > 128 or state.get("exitCode") in (130, 137, 143)

    def _outcome(self, job: dict, pods: dict[str, dict], run_policy: dict) -> list[tuple[str, str, str]]:
        meta = job["metadata"]
        label = f"{meta['namespace']}/{meta['name']}"
        master = pods.get(replica_name(meta["name"], "Master", 0))
        phases = {pod_name: pod["status"].get("phase") for pod_name, pod in pods.items()}
        restarts = sum(s.get("restartCount", 0) for p in pods.values() if p["status"].get("phase") == "Running"
                       for s in p["status"].get("containerStatuses", []))
        limit = run_policy.get("backoffLimit")
        started = (job.get("status") or {}).get("startTime")
        deadline = run_policy.get("activeDeadlineSeconds")
        if started and deadline and _seconds_since(started) > deadline:
            return [("Failed", "DeadlineExceeded",
                     f"PyTorchJob {meta['name']} has failed because it was active longer than specified deadline")]
        if limit is not None and (restarts > 0 if limit == 0 else restarts >= limit):  # the operator's own test
            return [("Failed", "BackoffLimitExceeded",
                     f"PyTorchJob {meta['name']} has failed because it has reached the specified backoff limit")]
        failed = [n for n, phase in phases.items() if phase == "Failed"]
        exit_code_policy = {n for n in failed if pods[n]["metadata"]["labels"][f"{LABEL}/replica-type"] in
                            [t.lower() for t, r in job["spec"]["pytorchReplicaSpecs"].items()
                             if r.get("restartPolicy") == "ExitCode"] and self._retryable(pods[n])}
        if set(failed) - exit_code_policy:
            kind = pods[failed[0]]["metadata"]["labels"][f"{LABEL}/replica-type"].capitalize()
            return [("Failed", "PyTorchJobFailed",
                     f"PyTorchJob {label} is failed because {len(failed)} {kind} replica(s) failed.")]
        if master is not None:
            succeeded = phases.get(master["metadata"]["name"]) == "Succeeded"
            running = phases.get(master["metadata"]["name"]) == "Running"
        elif "Master" not in job["spec"]["pytorchReplicaSpecs"]:  # Workers only: the operator's rule for them
            workers = [phase for pod_name, phase in phases.items()
                       if pods[pod_name]["metadata"]["labels"][f"{LABEL}/replica-type"] == "worker"]
            expected = int(job["spec"]["pytorchReplicaSpecs"].get("Worker", {}).get("replicas", 1))
            done = workers.count("Succeeded")
            succeeded = done == expected or (job["spec"].get("elasticPolicy") is not None and done > 0)
            running = "Running" in workers
        else:
            succeeded = running = False
        if succeeded:
            return [("Succeeded", "PyTorchJobSucceeded", f"PyTorchJob {label} successfully completed.")]
        if running and not condition_true(job, "Running"):
            return [("Running", "PyTorchJobRunning", f"PyTorchJob {label} is running.")]
        return []

    def _set_conditions(self, namespace: str, name: str, updates: list[tuple[str, str, str]]) -> None:
        def change(job: dict) -> None:
            status = job.setdefault("status", {})
            status.setdefault("startTime", now_rfc3339())
            conditions = status.setdefault("conditions", [])
            for kind, reason, message in updates:
                stamp = now_rfc3339()
                if kind in ("Running", "Restarting"):  # the operator keeps one of the two
                    conditions[:] = [c for c in conditions if c["type"] not in ("Running", "Restarting")]
                if kind in ("Succeeded", "Failed"):
                    for condition in conditions:
                        if condition["type"] == "Running":
                            condition.update(status="False", lastTransitionTime=stamp)
                    status["completionTime"] = stamp
                conditions[:] = [c for c in conditions if c["type"] != kind]
                conditions.append({"type": kind, "status": "True", "reason": reason, "message": message,
                                   "lastUpdateTime": stamp, "lastTransitionTime": stamp})

        self.store.mutate("pytorchjobs", namespace, name, change)

    def _finished(self, job: dict, pods: dict[str, dict], run_policy: dict) -> None:
        for pod in pods.values():
            if pod["status"].get("phase") in ("Pending", "Running") and not pod["metadata"].get("deletionTimestamp"):
                self._delete_pod(pod)
        ttl = run_policy.get("ttlSecondsAfterFinished")
        completed = (job.get("status") or {}).get("completionTime")
        if ttl is not None and completed and _seconds_since(completed) >= ttl:
            self.store.delete("pytorchjobs", job["metadata"]["namespace"], job["metadata"]["name"])
