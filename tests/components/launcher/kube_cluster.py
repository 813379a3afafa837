"""What acts on the stand-in's objects: the Training Operator, the scheduler and the kubelet, simulated.

- The operator gives a created PyTorchJob one pod per replica (`<job>-master-0`,
  `<job>-worker-<i>`, with the operator's `training.kubeflow.org/*` labels and an owner reference,
  so deleting the job deletes its pods) and walks the job through a scripted list of conditions,
  one step every `step_seconds`.
- The scheduler and kubelet move the pods along with the job (Pending/ContainerCreating, Running,
  Succeeded or Failed), or keep them Pending for a scripted problem, with the status and events
  the real components write: `unschedulable` (PodScheduled=False, reason Unschedulable, a
  FailedScheduling event) or `image-pull` (ErrImagePull then ImagePullBackOff, Failed/BackOff events).
- The kubelet writes the rank-0 pod's log: `log_text`, one line per tick while the job runs, the
  rest before it ends; each line carries an RFC 3339 timestamp with nanoseconds, as the kubelet's.
"""

from __future__ import annotations

import threading
import time
from datetime import datetime, timezone

from tests.components.launcher.kube_store import Store, now_rfc3339

SCRIPTS = {
    "succeed": ["Created", "Running", "Succeeded"],
    "fail": ["Created", "Running", "Failed"],
    "restart": ["Created", "Running", "Restarting", "Running", "Succeeded"],
    "hang": ["Created", "Running"],
}
UNSCHEDULABLE = ("0/4 nodes are available: 1 node(s) had untolerated taint {nvidia.com/gpu: present}, "
                 "3 Insufficient nvidia.com/gpu. preemption: 0/4 nodes are available: 4 No preemption victims "
                 "found for incoming pod.")


def kubelet_timestamp(nanoseconds: int) -> str:
    """RFC 3339 with nanoseconds, trailing zeros trimmed (Go's time.RFC3339Nano)."""
    seconds, fraction = divmod(nanoseconds, 10**9)
    base = datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
    digits = f"{fraction:09d}".rstrip("0")
    return f"{base}.{digits}Z" if digits else f"{base}Z"


class SimulatedCluster:
    """Drives jobs, pods, events and logs in `store` on a background thread."""

    def __init__(self, store: Store, script: str, step_seconds: float, log_text: str,
                 pod_problem: str | None) -> None:
        self.store = store
        self.script = ["Created"] if pod_problem else SCRIPTS[script]
        self.step_seconds = step_seconds
        self.pending_log = {}  # job key -> lines still to write
        self.log_text = log_text
        self.pod_problem = pod_problem
        self.created_at: dict[tuple[str, str], float] = {}
        self.steps_done: dict[tuple[str, str], int] = {}
        self.pod_states: dict[tuple[str, str], str] = {}
        self.logs: dict[tuple[str, str], list[tuple[int, str]]] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    # ---- the operator
    def job_created(self, job: dict) -> None:
        key = (job["metadata"]["namespace"], job["metadata"]["name"])
        with self.store.lock:
            self.created_at[key] = time.monotonic()
            self.steps_done[key] = 0
            self.pending_log[key] = self.log_text.splitlines()
            self._set_phase(key, 0)
            for replica_type, spec in job["spec"]["pytorchReplicaSpecs"].items():
                for index in range(spec.get("replicas", 1)):
                    self.store.create("pods", self._pod(job, replica_type.lower(), index, spec["template"]))

    def job_deleted(self, key: tuple[str, str]) -> None:
        """The garbage collector: pods owned by the job go with it."""
        for pod in self.store.list("pods", key[0], labels=f"training.kubeflow.org/job-name={key[1]}")[0]:
            self.store.delete("pods", (key[0], pod["metadata"]["name"]))
        self.created_at.pop(key, None)

    def _pod(self, job: dict, replica_type: str, index: int, template: dict) -> dict:
        name = job["metadata"]["name"]
        labels = {**template.get("metadata", {}).get("labels", {}), "training.kubeflow.org/job-name": name,
                  "training.kubeflow.org/operator-name": "pytorchjob-controller",
                  "training.kubeflow.org/replica-type": replica_type,
                  "training.kubeflow.org/replica-index": str(index)}
        if replica_type == "master":
            labels["training.kubeflow.org/job-role"] = "master"
        owner = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": name,
                 "uid": job["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}
        return {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": f"{name}-{replica_type}-{index}", "namespace": job["metadata"]["namespace"],
                             "labels": labels, "ownerReferences": [owner]},
                "spec": template["spec"], "status": {"phase": "Pending", "qosClass": "BestEffort"}}

    def _set_phase(self, key: tuple[str, str], step: int) -> None:
        def change(job: dict) -> None:
            conditions = [{"type": phase, "status": "False", "reason": f"PyTorchJob{phase}",
                           "lastUpdateTime": now_rfc3339(), "lastTransitionTime": now_rfc3339()}
                          for phase in self.script[:step + 1]]
            conditions[-1]["status"] = "True"
            job["status"] = {"conditions": conditions, "startTime": now_rfc3339()}

        self.store.update("pytorchjobs", key, change)

    # ---- the loop
    def _run(self) -> None:
        while not self.stop.wait(self.step_seconds / 4):
            with self.store.lock:
                for key in list(self.created_at):
                    self._tick(key)

    def _tick(self, key: tuple[str, str]) -> None:
        reached = min(int((time.monotonic() - self.created_at[key]) / self.step_seconds), len(self.script) - 1)
        while self.steps_done[key] < reached:
            phase = self.script[self.steps_done[key] + 1]
            if phase in ("Succeeded", "Failed"):
                self._write_rank_zero_log(key, len(self.pending_log[key]))  # the trainer's last words first
            self.steps_done[key] += 1
            self._set_phase(key, self.steps_done[key])
        phase = self.script[self.steps_done[key]]
        for pod in self.store.list("pods", key[0], labels=f"training.kubeflow.org/job-name={key[1]}")[0]:
            self._move_pod(pod, phase)
        if phase in ("Running", "Restarting"):
            self._write_rank_zero_log(key, 1)

    def _write_rank_zero_log(self, key: tuple[str, str], count: int) -> None:
        lines, self.pending_log[key] = self.pending_log[key][:count], self.pending_log[key][count:]
        pods = self.store.list("pods", key[0], labels=f"training.kubeflow.org/job-name={key[1]}")[0]
        names = sorted(p["metadata"]["name"] for p in pods)
        rank_zero = next((n for n in names if n.endswith("-master-0")), f"{key[1]}-worker-0")
        for line in lines:
            self.write_log(key[0], rank_zero, line)

    def write_log(self, namespace: str, pod: str, text: str) -> None:
        for line in text.splitlines():
            self.logs.setdefault((namespace, pod), []).append((time.time_ns(), line))

    # ---- the scheduler and the kubelet
    def _move_pod(self, pod: dict, phase: str) -> None:
        key = (pod["metadata"]["namespace"], pod["metadata"]["name"])
        if self.pod_problem:
            state = self.pod_problem if self.pod_states.get(key) is None else "image-pull-backoff" \
                if self.pod_problem == "image-pull" else self.pod_problem
        else:
            state = {"Created": "creating", "Running": "running", "Restarting": "running",
                     "Succeeded": "succeeded", "Failed": "failed"}[phase]
        if self.pod_states.get(key) == state:
            return
        self.pod_states[key] = state
        self.store.update("pods", key, lambda obj: obj.update(status=pod_status(obj, state)))
        for event_type, reason, message, source in pod_events(pod, state):
            self._event(pod, event_type, reason, message, source)

    def _event(self, pod: dict, event_type: str, reason: str, message: str, source: str) -> None:
        namespace, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        stamp = now_rfc3339()
        self.store.create("events", {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": f"{name}.{time.time_ns():x}", "namespace": namespace},
            "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": name, "namespace": namespace,
                               "uid": pod["metadata"].get("uid", "")},
            "reason": reason, "message": message, "type": event_type, "count": 1, "firstTimestamp": stamp,
            "lastTimestamp": stamp, "source": {"component": source}, "reportingComponent": source,
            "reportingInstance": ""})


def _container_status(pod: dict, state: dict, ready: bool = False) -> dict:
    image = pod["spec"]["containers"][0]["image"]
    return {"name": "pytorch", "image": image, "imageID": "", "ready": ready, "restartCount": 0,
            "started": "running" in state, "state": state}


def pod_status(pod: dict, state: str) -> dict:
    """The status the scheduler and the kubelet would write for `state`."""
    scheduled = {"type": "PodScheduled", "status": "True", "lastTransitionTime": now_rfc3339()}
    image = pod["spec"]["containers"][0]["image"]
    waiting = {"creating": ("ContainerCreating", None), "image-pull": ("ErrImagePull", f'failed to pull "{image}"'),
               "image-pull-backoff": ("ImagePullBackOff", f'Back-off pulling image "{image}"')}
    if state == "unschedulable":
        return {"phase": "Pending", "qosClass": "BestEffort", "conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": UNSCHEDULABLE,
             "lastTransitionTime": now_rfc3339()}]}
    if state in waiting:
        reason, message = waiting[state]
        return {"phase": "Pending", "qosClass": "BestEffort", "conditions": [scheduled],
                "containerStatuses": [_container_status(pod, {"waiting": {"reason": reason, "message": message}})]}
    if state == "running":
        return {"phase": "Running", "qosClass": "BestEffort", "conditions": [scheduled], "startTime": now_rfc3339(),
                "containerStatuses": [_container_status(pod, {"running": {"startedAt": now_rfc3339()}}, True)]}
    code = 0 if state == "succeeded" else 1
    terminated = {"exitCode": code, "reason": "Completed" if code == 0 else "Error", "startedAt": now_rfc3339(),
                  "finishedAt": now_rfc3339()}
    return {"phase": "Succeeded" if code == 0 else "Failed", "qosClass": "BestEffort", "conditions": [scheduled],
            "containerStatuses": [_container_status(pod, {"terminated": terminated})]}


def pod_events(pod: dict, state: str) -> list[tuple[str, str, str, str]]:
    """(type, reason, message, source) of the events written when a pod enters `state`."""
    name, image = pod["metadata"]["name"], pod["spec"]["containers"][0]["image"]
    namespace = pod["metadata"]["namespace"]
    if state == "unschedulable":
        return [("Warning", "FailedScheduling", UNSCHEDULABLE, "default-scheduler")]
    if state == "image-pull":
        return [("Normal", "Scheduled", f"Successfully assigned {namespace}/{name} to gpu-node-1", "default-scheduler"),
                ("Normal", "Pulling", f'Pulling image "{image}"', "kubelet"),
                ("Warning", "Failed", f'Failed to pull image "{image}": rpc error: code = NotFound desc = failed to '
                 f'pull and unpack image "{image}": not found', "kubelet"),
                ("Warning", "Failed", "Error: ErrImagePull", "kubelet")]
    if state == "image-pull-backoff":
        return [("Normal", "BackOff", f'Back-off pulling image "{image}"', "kubelet"),
                ("Warning", "Failed", "Error: ImagePullBackOff", "kubelet")]
    if state == "running":
        return [("Normal", "Started", "Started container pytorch", "kubelet")]
    return []
