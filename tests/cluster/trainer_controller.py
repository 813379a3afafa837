"""Kubeflow Trainer v2's TrainJob controller, with JobSet and the Job controller underneath, emulated.

Admission (`admit`, Trainer's validating webhook): the runtime `spec.runtimeRef` names must exist
(a TrainingRuntime in the namespace, or a ClusterTrainingRuntime); `spec.trainer.env` must not set
the torch plugin's variables; each runtime patch has its own domain-prefixed manager, patches only
replicated jobs and containers the runtime has, and sets no env of the `node` container.

Reconciling a TrainJob (`sync`, every 0.1 s):
- the pod template is the runtime's, with the runtime patches and the trainer applied
  (`trainer_merge.py`); the trainer job is an Indexed Job of `numNodes` pods (the TrainJob's, else the
  runtime's `mlPolicy.numNodes`) named `<job>-node-0-<index>-<suffix>`, with hostname
  `<job>-node-0-<index>` and subdomain `<job>` (each `<hostname>.<job>` resolves, through every pod's
  /etc/hosts, to a loopback address of its own), JobSet's and the Job controller's labels
  (`jobset-name`, `replicatedjob-name`, `job-index`, `restart-attempt`, `job-completion-index`), the
  completion-index annotation, and the Job controller's `batch.kubernetes.io/job-tracking`
  finalizer, which is removed once the pod's end has been counted;
- a failed pod is matched against the job's `podFailurePolicy` (a container's exit codes, or a pod
  condition such as DisruptionTarget): FailJob fails the Job (reason PodFailurePolicy), Ignore
  replaces the pod without counting, Count (and no match) counts it against `backoffLimit`; past it
  the Job fails (BackoffLimitExceeded);
- a failed Job is handled by the JobSet's `failurePolicy`: the first rule whose
  `onJobFailureReasons` has the Job's reason decides (FailJobSet, RestartJobSet,
  RestartJobSetAndIgnoreMaxRestarts; no rule: RestartJobSet); a restart deletes every pod of the
  attempt and, once they are gone, creates the next attempt's (`restart-attempt` + 1); a counted
  restart past `maxRestarts`, or a failure without a failurePolicy, fails the JobSet;
- the TrainJob's status is what Trainer v2.3 writes: `jobsStatus` of the trainer job, and the
  conditions Complete (every index succeeded: JobSet's `AllJobsCompleted`), Failed (JobSet's reason,
  or DeadlineExceeded past `activeDeadlineSeconds` from its creation) and Suspended (`spec.suspend`);
  pods still running when it ends are stopped;
- a deleted TrainJob's pods go (garbage collection, by the `jobset-uid` label).

Kubeflow Trainer's dataset and model initializers (`initializers.py`): each initializer job of the runtime is one
pod (`<job>-<step>-0-0-<suffix>`, its job's `backoffLimit` counting its failures; past it the Job fails
BackoffLimitExceeded, which the JobSet's failurePolicy handles like any Job's), built as Trainer's builder builds it
from `spec.initializer`, with the JobSet's claims as volumes; the trainer job starts once every job in its
`dependsOn` is Complete; a JobSet restart runs them again (the claim keeps what they fetched). `status.jobsStatus`
lists them before the trainer job, as JobSet lists its replicated jobs.

What differs, forced by sharing this machine's network as in `training_operator.py`: each TrainJob's
master port (PET_MASTER_PORT) is a free port of this machine, not 29500. A JobSet restart always waits for the old
pods to be gone (`BlockingRecreate`); `dependsOn` waits for Complete whatever status it names.
"""

from __future__ import annotations

import copy
import datetime
import re
import secrets
from dataclasses import dataclass, field

from tests.cluster.initializers import admission_problems, apply_initializer, claim_volumes, step_of
from tests.cluster.kubelet import Kubelet
from tests.cluster.store import NotFound, Store, now_rfc3339
from tests.cluster.trainer_merge import TORCH_ENV, apply_trainer, merged_jobset_spec, trainer_job
from tests.cluster.training_operator import free_port

JOBSET = "jobset.sigs.k8s.io"
TRACKING_FINALIZER = "batch.kubernetes.io/job-tracking"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
_MANAGER = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_./]*[A-Za-z0-9])?$")


@dataclass
class JobSetState:
    """What the JobSet and Job controllers keep about one TrainJob."""

    port: int
    attempt: int = 0
    restarts: int = 0  # counted against maxRestarts
    failures: int = 0  # failed pods counted against backoffLimit in this attempt
    pods: dict[int, str] = field(default_factory=dict)  # completion index -> current pod
    succeeded: set[int] = field(default_factory=set)
    recreating: bool = False  # the previous attempt's pods are being deleted
    steps: dict[str, str] = field(default_factory=dict)  # initializer job -> its current pod
    steps_done: set[str] = field(default_factory=set)  # initializer jobs Complete in this attempt
    step_failures: dict[str, int] = field(default_factory=dict)  # initializer job -> failed pods this attempt


def _seconds_since(stamp: str) -> float:
    then = datetime.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.timezone.utc)
    return (datetime.datetime.now(datetime.timezone.utc) - then).total_seconds()


def condition(job: dict, kind: str) -> dict | None:
    return next((c for c in (job.get("status") or {}).get("conditions") or []
                 if c["type"] == kind and c["status"] == "True"), None)


class TrainerController:
    def __init__(self, store: Store, kubelet: Kubelet) -> None:
        self.store = store
        self.kubelet = kubelet
        self.jobsets: dict[str, JobSetState] = {}  # TrainJob uid -> state
        self.status_server = None  # the TrainJobStatus gate's server (trainer_status.py), when it is on

    # ---- the webhook

    def runtime_of(self, trainjob: dict) -> dict | None:
        ref = trainjob["spec"]["runtimeRef"]
        kind = ref.get("kind") or "ClusterTrainingRuntime"
        try:
            if kind == "TrainingRuntime":
                return self.store.get("trainingruntimes", trainjob["metadata"]["namespace"], ref["name"])
            return self.store.get("clustertrainingruntimes", "", ref["name"])
        except NotFound:
            return None

    def admit(self, trainjob: dict) -> list[str]:
        """What Trainer's validating webhook refuses in a TrainJob about to be created."""
        ref = trainjob["spec"]["runtimeRef"]
        runtime = self.runtime_of(trainjob)
        if runtime is None:
            kind = ref.get("kind") or "ClusterTrainingRuntime"
            return [f"spec.runtimeRef: Invalid value: {ref}: {kind.lower()}s.trainer.kubeflow.org \"{ref['name']}\" "
                    "not found: specified trainingRuntime must be created before the TrainJob is created"]
        problems = []
        reserved = sorted({e["name"] for e in (trainjob["spec"].get("trainer") or {}).get("env") or []} & set(TORCH_ENV))
        if reserved:
            problems.append(f"spec.trainer.env: Invalid value: must not have reserved envs, invalid envs configured: "
                            f"{reserved}")
        return problems + admission_problems(trainjob, runtime) + self._patch_problems(trainjob, runtime)

    @staticmethod
    def _patch_problems(trainjob: dict, runtime: dict) -> list[str]:
        containers = {job["name"]: {c["name"] for c in job["template"]["spec"]["template"]["spec"].get("containers", [])}
                      for job in runtime["spec"]["template"]["spec"]["replicatedJobs"]}
        problems, managers = [], []
        for patch in trainjob["spec"].get("runtimePatches") or []:
            managers.append(patch["manager"])
            if not _MANAGER.match(patch["manager"]):
                problems.append(f"spec.runtimePatches.manager: Invalid value: {patch['manager']!r}: must be a "
                                "domain-prefixed path (such as \"acme.io/foo\")")
            spec = ((patch.get("trainingRuntimeSpec") or {}).get("template") or {}).get("spec") or {}
            for job in spec.get("replicatedJobs") or []:
                if job["name"] not in containers:
                    problems.append("spec.runtimePatches: must not have replicated job that doesn't exist in the "
                                    "runtime job template")
                    continue
                pod = (((job.get("template") or {}).get("spec") or {}).get("template") or {}).get("spec") or {}
                for container in pod.get("containers") or []:
                    if container["name"] not in containers[job["name"]]:
                        problems.append(f"spec.runtimePatches: must not have container that doesn't exist in the "
                                        f"runtime job {job['name']}")
                    elif container.get("env") and container["name"] == "node":
                        problems.append("spec.runtimePatches: must not have envs for the dataset-initializer, "
                                        "model-initializer, node containers")
        duplicated = sorted({m for m in managers if managers.count(m) > 1})
        if duplicated:
            problems.append(f"spec.runtimePatches[manager]: Duplicate value: {duplicated}")
        return problems

    # ---- the control loop

    def sync(self) -> None:
        jobs, _ = self.store.list("trainjobs")
        for job in jobs:
            self._reconcile(job)
        uids = {job["metadata"]["uid"] for job in jobs}
        for uid in set(self.jobsets) - uids:
            del self.jobsets[uid]
        pods, _ = self.store.list("pods", label_selector=f"{JOBSET}/jobset-uid")
        for pod in pods:
            if pod["metadata"]["labels"][f"{JOBSET}/jobset-uid"] not in uids:  # garbage collection
                self._delete_pod(pod)
                self._release(pod)

    def _pods(self, job: dict) -> list[dict]:
        return self.store.list("pods", job["metadata"]["namespace"],
                               f"{JOBSET}/jobset-uid={job['metadata']['uid']}")[0]

    def _reconcile(self, job: dict) -> None:
        meta, spec = job["metadata"], job["spec"]
        state = self.jobsets.setdefault(meta["uid"], JobSetState(port=free_port()))
        pods = self._pods(job)
        if condition(job, "Complete") or condition(job, "Failed"):
            for pod in pods:
                if pod["status"].get("phase") in ("Pending", "Running"):
                    self._delete_pod(pod)
                self._release(pod)
            if condition(job, "Failed"):
                self._set_jobs_status(job, state, [], 1, [], failed=True)
            return
        if spec.get("suspend"):
            self._set_condition(job, "Suspended", "True", "Suspended", "TrainJob is suspended")
            return
        deadline = spec.get("activeDeadlineSeconds")
        if deadline and _seconds_since(meta["creationTimestamp"]) > deadline:
            self._set_condition(job, "Failed", "True", "DeadlineExceeded", "TrainJob exceeded its active deadline")
            return
        runtime = self.runtime_of(job)
        jobset = merged_jobset_spec(runtime, job)
        num_nodes = (spec.get("trainer") or {}).get("numNodes") or runtime["spec"].get("mlPolicy", {}).get("numNodes", 1)
        steps = [rjob["name"] for rjob in jobset["replicatedJobs"] if step_of(rjob)]
        if state.recreating:  # the previous attempt's pods end (and are let go) before the next attempt starts
            for pod in pods:
                self._release(pod)
            if pods:
                self._set_jobs_status(job, state, pods, num_nodes, steps)
                return
            state.recreating = False
        trainer_name = trainer_job(jobset)["name"]
        outcome = self._follow_initializers(job, jobset, state, [p for p in pods if self._job_of(p) != trainer_name])
        waits_for = {dependency["name"] for dependency in trainer_job(jobset).get("dependsOn") or []}
        if outcome is None and waits_for <= state.steps_done:
            outcome = self._follow_job(job, jobset, state, [p for p in pods if self._job_of(p) == trainer_name],
                                       num_nodes)
        if outcome is not None:
            self._jobset_failed(job, jobset, state, pods, *outcome)
        elif len(state.succeeded) == num_nodes:
            self._set_condition(job, "Complete", "True", "AllJobsCompleted", "jobset completed successfully")
        self._set_jobs_status(job, state, pods, num_nodes, steps)

    def _ended(self, pods: list[dict]) -> list[dict]:
        """The pods that ended and are not counted yet (they still carry the Job's tracking finalizer), released."""
        ended = [pod for pod in pods if pod["status"].get("phase") in ("Succeeded", "Failed")
                 and TRACKING_FINALIZER in (pod["metadata"].get("finalizers") or [])]
        for pod in ended:
            self._release(pod)
        return ended

    @staticmethod
    def _job_of(pod: dict) -> str:
        return pod["metadata"]["labels"][f"{JOBSET}/replicatedjob-name"]

    # ---- the initializers' Jobs: one pod each, backoffLimit

    def _follow_initializers(self, job: dict, jobset: dict, state: JobSetState,
                             pods: list[dict]) -> tuple[str, str] | None:
        """Create each initializer job's pod, count ended ones; (reason, message) when one's Job fails."""
        jobs = {rjob["name"]: rjob for rjob in jobset["replicatedJobs"] if step_of(rjob)}
        for pod in self._ended(pods):
            labels = pod["metadata"]["labels"]
            step = self._job_of(pod)
            if labels[f"{JOBSET}/restart-attempt"] != str(state.attempt) or step not in jobs:
                continue
            state.steps.pop(step, None)
            if pod["status"]["phase"] == "Succeeded":
                state.steps_done.add(step)
                continue
            state.step_failures[step] = state.step_failures.get(step, 0) + 1
            if state.step_failures[step] > int(jobs[step]["template"]["spec"].get("backoffLimit", 6)):
                return "BackoffLimitExceeded", f"Job {job['metadata']['name']}-{step}-0 has reached the specified " \
                                               "backoff limit"
        for step, rjob in jobs.items():
            if step not in state.steps_done and step not in state.steps:
                state.steps[step] = self._create_step_pod(job, jobset, rjob, state)
        return None

    def _create_step_pod(self, job: dict, jobset: dict, rjob: dict, state: JobSetState) -> str:
        meta, step = job["metadata"], rjob["name"]
        hostname = f"{meta['name']}-{step}-0-0"
        pod_name = f"{hostname}-{secrets.token_hex(3)[:5]}"
        template = apply_initializer(rjob, job)
        labels = {**(template.get("metadata") or {}).get("labels", {}), f"{JOBSET}/jobset-name": meta["name"],
                  f"{JOBSET}/jobset-uid": meta["uid"], f"{JOBSET}/replicatedjob-name": step, f"{JOBSET}/job-index": "0",
                  f"{JOBSET}/restart-attempt": str(state.attempt), COMPLETION_INDEX: "0",
                  "batch.kubernetes.io/job-name": f"{meta['name']}-{step}-0"}
        spec = {**template["spec"], "hostname": hostname, "subdomain": meta["name"]}
        spec["volumes"] = [*(spec.get("volumes") or []), *claim_volumes(jobset, meta["name"])]
        spec["restartPolicy"] = spec.get("restartPolicy") or "Never"
        self.store.create("pods", {"metadata": {"name": pod_name, "namespace": meta["namespace"], "labels": labels,
                                                "annotations": {COMPLETION_INDEX: "0"},
                                                "finalizers": [TRACKING_FINALIZER]},
                                   "spec": spec, "status": {"phase": "Pending"}})
        return pod_name

    # ---- the Job: pods by completion index, podFailurePolicy, backoffLimit

    def _follow_job(self, job: dict, jobset: dict, state: JobSetState, pods: list[dict],
                    num_nodes: int) -> tuple[str, str] | None:
        """Create missing pods, count ended ones; (reason, message) when the Job fails, else None."""
        template = apply_trainer(jobset, job, num_nodes, state.port)
        template["spec"]["volumes"] = [*(template["spec"].get("volumes") or []),
                                       *claim_volumes(jobset, job["metadata"]["name"])]
        job_spec = trainer_job(jobset)["template"]["spec"]
        for pod in self._ended(pods):
            labels = pod["metadata"]["labels"]
            if labels[f"{JOBSET}/restart-attempt"] != str(state.attempt):
                continue
            index = int(labels[COMPLETION_INDEX])
            if pod["status"]["phase"] == "Succeeded":
                state.succeeded.add(index)
                continue
            failure = self._count_failure(job_spec, pod, state)
            if failure is not None:
                return failure
            state.pods.pop(index, None)
        for index in range(num_nodes):
            if index not in state.succeeded and index not in state.pods:
                state.pods[index] = self._create_pod(job, template, index, num_nodes, state)
        return None

    def _count_failure(self, job_spec: dict, pod: dict, state: JobSetState) -> tuple[str, str] | None:
        """Apply the podFailurePolicy to a failed pod; (reason, message) when the Job fails."""
        where = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
        for number, rule in enumerate((job_spec.get("podFailurePolicy") or {}).get("rules") or []):
            if self._matches(rule, pod):
                if rule["action"] == "FailJob":
                    return "PodFailurePolicy", f"Pod {where} has condition or exit code matching FailJob rule at index {number}"
                if rule["action"] == "Ignore":
                    return None
                break
        state.failures += 1
        if state.failures > int(job_spec.get("backoffLimit", 6)):
            return "BackoffLimitExceeded", "Job has reached the specified backoff limit"
        return None

    @staticmethod
    def _matches(rule: dict, pod: dict) -> bool:
        if "onExitCodes" in rule:
            codes = rule["onExitCodes"]
            for status in pod["status"].get("containerStatuses") or []:
                code = (status.get("state") or {}).get("terminated", {}).get("exitCode")
                if code is None or (codes.get("containerName") and codes["containerName"] != status["name"]):
                    continue
                if (code in codes["values"]) == (codes["operator"] == "In") and code != 0:
                    return True
            return False
        wanted = {(c["type"], c.get("status", "True")) for c in rule.get("onPodConditions") or []}
        return any((c["type"], c["status"]) in wanted for c in pod["status"].get("conditions") or [])

    def _create_pod(self, job: dict, template: dict, index: int, num_nodes: int, state: JobSetState) -> str:
        meta = job["metadata"]
        name, hostname = meta["name"], f"{meta['name']}-node-0-{index}"
        pod_name = f"{hostname}-{secrets.token_hex(3)[:5]}"
        labels = {**(template.get("metadata") or {}).get("labels", {}), f"{JOBSET}/jobset-name": name,
                  f"{JOBSET}/jobset-uid": meta["uid"], f"{JOBSET}/replicatedjob-name": "node", f"{JOBSET}/job-index": "0",
                  f"{JOBSET}/restart-attempt": str(state.attempt), COMPLETION_INDEX: str(index),
                  "batch.kubernetes.io/job-name": f"{name}-node-0", "trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}
        annotations = {**(template.get("metadata") or {}).get("annotations", {}), COMPLETION_INDEX: str(index)}
        spec = {**copy.deepcopy(template["spec"]), "hostname": hostname, "subdomain": name}
        spec["restartPolicy"] = spec.get("restartPolicy") or "Never"
        if self.status_server is not None:
            self.status_server.inject(job, spec)
        hosts = {}
        for other in range(num_nodes):
            address = f"127.0.0.{2 + other}"
            hosts[f"{name}-node-0-{other}"] = hosts[f"{name}-node-0-{other}.{name}"] = address
        self.kubelet.hosts[(meta["namespace"], pod_name)] = hosts
        self.store.create("pods", {"metadata": {"name": pod_name, "namespace": meta["namespace"], "labels": labels,
                                                "annotations": annotations, "finalizers": [TRACKING_FINALIZER]},
                                   "spec": spec, "status": {"phase": "Pending"}})
        return pod_name

    # ---- the JobSet

    def _jobset_failed(self, job: dict, jobset: dict, state: JobSetState, pods: list[dict], reason: str,
                       message: str) -> None:
        policy = jobset.get("failurePolicy")
        if policy is None:
            self._set_condition(job, "Failed", "True", "FailedJobs", f"jobset failed due to one or more job failures: "
                                f"{reason}: {message}")
            return
        rule = next((r for r in policy.get("rules") or [] if not r.get("onJobFailureReasons")
                     or reason in r["onJobFailureReasons"]), None)
        action = rule["action"] if rule else "RestartJobSet"
        if action == "FailJobSet":
            self._set_condition(job, "Failed", "True", "FailJobSetActionApplied", f"{reason}: {message}")
            return
        if action == "RestartJobSet":
            if state.restarts >= int(policy.get("maxRestarts", 0)):
                self._set_condition(job, "Failed", "True", "ReachedMaxRestarts",
                                    f"jobset failed due to reaching max number of restarts ({reason}: {message})")
                return
            state.restarts += 1
        state.attempt, state.failures, state.pods, state.succeeded = state.attempt + 1, 0, {}, set()
        state.steps, state.steps_done, state.step_failures = {}, set(), {}
        state.recreating = True
        for pod in pods:
            self._delete_pod(pod)

    # ---- writes

    def _delete_pod(self, pod: dict) -> None:
        self.store.mutate("pods", pod["metadata"]["namespace"], pod["metadata"]["name"],
                          lambda p: p["metadata"].setdefault("deletionTimestamp", now_rfc3339()))

    def _release(self, pod: dict) -> None:
        """Remove the Job controller's finalizer from an ended pod (a deleted one then goes)."""
        namespace, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        if pod["status"].get("phase") not in ("Succeeded", "Failed") or not pod["metadata"].get("finalizers"):
            return
        updated = self.store.mutate("pods", namespace, name, lambda p: p["metadata"].pop("finalizers", None))
        if updated is not None and updated["metadata"].get("deletionTimestamp"):
            try:
                self.store.delete("pods", namespace, name)
            except NotFound:
                pass

    def _set_condition(self, job: dict, kind: str, status: str, reason: str, message: str) -> None:
        def change(current: dict) -> None:
            conditions = current.setdefault("status", {}).setdefault("conditions", [])
            existing = next((c for c in conditions if c["type"] == kind), None)
            if existing and (existing["status"], existing["reason"]) == (status, reason):
                return
            conditions[:] = [c for c in conditions if c["type"] != kind]
            conditions.append({"type": kind, "status": status, "reason": reason, "message": message,
                               "lastTransitionTime": now_rfc3339(), "observedGeneration": 1})

        self.store.mutate("trainjobs", job["metadata"]["namespace"], job["metadata"]["name"], change)

    def _set_jobs_status(self, job: dict, state: JobSetState, pods: list[dict], num_nodes: int, steps: list[str],
                         failed: bool = False) -> None:
        """`status.jobsStatus`: the initializer jobs (`steps`), then the trainer job (one Job each: counts are 0 or
        1, as JobSet counts child Jobs)."""
        current = [p for p in pods if p["metadata"]["labels"][f"{JOBSET}/restart-attempt"] == str(state.attempt)]
        statuses = []
        for step in steps:
            running = any(self._job_of(p) == step and p["status"].get("phase") == "Running" for p in current)
            done = step in state.steps_done
            statuses.append({"name": step, "ready": int(running), "succeeded": int(done), "failed": 0,
                             "active": int(not done), "suspended": 0})
        running = sum(self._job_of(p) == "node" and p["status"].get("phase") == "Running" for p in current)
        done = len(state.succeeded) == num_nodes and not failed
        statuses.append({"name": "node",
                         "ready": int(running + len(state.succeeded) >= num_nodes and not done and not failed),
                         "succeeded": int(done), "failed": int(failed), "active": int(not done and not failed),
                         "suspended": 0})
        self.store.mutate("trainjobs", job["metadata"]["namespace"], job["metadata"]["name"],
                          lambda j: j.setdefault("status", {}).update(jobsStatus=statuses))
