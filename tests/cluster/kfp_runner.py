"""A KFP v2 backend on the emulated cluster: runs a compiled pipeline's tasks as pods, as KFP does.

For each task, in the DAG's order (nested DAGs, `dsl.If` conditions and the exit handler's
"run when upstream is done" included), it builds what the KFP driver builds (`kfp_ir.py`): the
executor input with `minio://` or `s3://` artifact URIs under the pipeline root, and a pod whose
container runs the IR's own `command` and `args` (so `python3 -m kfp.dsl.executor_main` runs the
component, after the IR's pip step) with exactly the env the IR's `platforms.kubernetes` section
declares, as the run's service account. The kubelet (`kubelet.py`) resolves that env from the
Secrets and ConfigMaps stored in the emulated API and runs the container sandboxed; this module
plays the KFP launcher inside the pod: it downloads the input artifacts from the object store to
their mount paths (`/minio/<bucket>/...`) before the command starts and uploads the outputs from
them afterwards, reads the executor output and the output parameter files. Between tasks only the
object store carries anything.

Caching works as KFP's does: a task whose `cachingOptions.enableCache` is on and whose component
and inputs (parameter values, input artifact URIs) match an earlier execution recorded in the
`ExecutionCache` given to the run reuses that execution's outputs without a pod. `cancel()`
terminates the run as KFP does: the running task's pod is deleted (SIGTERM, then SIGKILL after
the grace period) and no further task starts.

With `retries=True` a failed task is run again up to its `retryPolicy.maxRetryCount`, as a new
execution (new pod, new output URIs), at once: the policy's backoff is not waited for.

Where it differs from KFP, on purpose: a pod that stays Pending (unschedulable, a missing Secret,
an image it cannot pull) fails its task after `pending_limit` seconds with the pod's reason, where
KFP would wait; retries are off unless asked for; the launcher's object store session is the
test's (KFP reads it from its own Secret).
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.cluster import kfp_ir
from tests.cluster.cluster import Cluster
from tests.cluster.kubelet import ContainerLog, PodHooks
from tests.cluster.sandbox import PodFilesystem
from tests.cluster.store import NotFound, now_rfc3339

FINAL = ("Succeeded", "Failed")
WAITING_REASONS = ("CreateContainerConfigError", "ImagePullBackOff", "ErrImagePull", "CrashLoopBackOff")


@dataclass
class TaskResult:
    name: str
    state: str  # SUCCEEDED, FAILED, CANCELLED, SKIPPED (upstream failed or condition false), NOT_RUN (skipped)
    pod: str = ""
    error: str = ""
    log: str = ""
    env: dict[str, str] = field(default_factory=dict)
    executor_input: dict = field(default_factory=dict)
    parameters: dict[str, Any] = field(default_factory=dict)
    artifacts: dict[str, list[dict]] = field(default_factory=dict)
    not_emulated: list[str] = field(default_factory=list)
    seconds: float = 0.0
    attempts: int = 1


class ObjectStore:
    """The KFP launcher's own session with the artifact store (boto3 against one endpoint)."""

    def __init__(self, endpoint: str, credentials: dict[str, str]) -> None:
        import boto3

        self.client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=credentials["AWS_ACCESS_KEY_ID"],
                                   aws_secret_access_key=credentials["AWS_SECRET_ACCESS_KEY"], region_name="us-east-1")

    @staticmethod
    def split(uri: str) -> tuple[str, str]:
        bucket, _, key = uri.split("://", 1)[1].partition("/")
        return bucket, key

    def download(self, uri: str, target: Path) -> int:
        """Download a file or every object below a prefix (KFP's DownloadBlob); returns the file count."""
        from botocore.exceptions import ClientError

        bucket, key = self.split(uri)
        try:
            self.client.head_object(Bucket=bucket, Key=key)
            target.parent.mkdir(parents=True, exist_ok=True)
            self.client.download_file(bucket, key, str(target))
            return 1
        except ClientError:
            pass
        count = 0
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=key.rstrip("/") + "/"):
            for item in page.get("Contents", []):
                destination = target / item["Key"][len(key.rstrip("/")) + 1:]
                destination.parent.mkdir(parents=True, exist_ok=True)
                self.client.download_file(bucket, item["Key"], str(destination))
                count += 1
        if count == 0:
            raise FileNotFoundError(f"failed to download input artifact from remote storage URI {uri}: not found")
        return count

    def upload(self, source: Path, uri: str) -> int:
        bucket, key = self.split(uri)
        if source.is_file():
            self.client.upload_file(str(source), bucket, key)
            return 1
        files = sorted(p for p in source.rglob("*") if p.is_file())
        for path in files:
            self.client.upload_file(str(path), bucket, f"{key.rstrip('/')}/{path.relative_to(source).as_posix()}")
        return len(files)


class ExecutionCache:
    """KFP's execution cache: (component, inputs) -> the outputs of the execution that produced them."""

    def __init__(self) -> None:
        self.entries: dict[str, TaskResult] = {}
        self.hits: list[str] = []

    @staticmethod
    def key(component: dict, executor: dict) -> str:
        inputs = {"parameters": executor["inputs"].get("parameterValues", {}),
                  "artifacts": {name: [a["uri"] for a in items["artifacts"]]
                                for name, items in executor["inputs"].get("artifacts", {}).items()}}
        return json.dumps([component, inputs], sort_keys=True)


class KfpRun:
    """One pipeline run. `skip`: names of container tasks not to run (NOT_RUN, and so are their dependents)."""

    def __init__(self, cluster: Cluster, package: Path, *, namespace: str, service_account: str,
                 pipeline_root: str, object_store: ObjectStore, arguments: dict[str, Any],
                 skip: set[str] = frozenset(), pending_limit: float = 20.0, task_timeout: float = 600.0,
                 cache: ExecutionCache | None = None, retries: bool = False) -> None:
        self.cluster = cluster
        self.spec, self.platform = kfp_ir.load_package(package)
        self.namespace, self.service_account = namespace, service_account
        self.pipeline_root = pipeline_root.rstrip("/")
        self.store = object_store
        self.arguments = arguments
        self.skip = set(skip)
        self.pending_limit, self.task_timeout = pending_limit, task_timeout
        self.run_id = str(uuid.uuid4())
        self.name = self.spec["pipelineInfo"]["name"]
        self.results: dict[str, TaskResult] = {}
        self.cache = cache
        self.retries = retries
        self.current_pod = ""
        self.cancelled = False
        self._thread: threading.Thread | None = None

    def start(self) -> KfpRun:
        """Run in the background (`join()` waits for the results)."""
        self._thread = threading.Thread(target=self.run, daemon=True, name=f"kfp-run-{self.run_id[:8]}")
        self._thread.start()
        return self

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def join(self, timeout: float | None = None) -> dict[str, TaskResult]:
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"run {self.run_id} still running after {timeout} s")
        return self.results

    def wait_for(self, predicate: Callable[[], Any], timeout: float, what: str) -> Any:
        """`predicate()` once it is true, as `Cluster.wait_for`; a run that ends first fails at once, naming its
        failed tasks' errors (a pod that cannot start does not wait out the timeout)."""
        deadline = time.monotonic() + timeout
        while True:
            value = predicate()
            if value:
                return value
            if self._thread is not None and not self._thread.is_alive():
                failed = {name: r for name, r in self.results.items() if r.state == "FAILED" and r.pod}
                logs = "".join(f"\n--- {name}: {r.error}\n" + "\n".join(r.log.splitlines()[-40:])
                               for name, r in failed.items())
                raise AssertionError(f"{what}: the run ended first; failed tasks: {sorted(failed) or 'none'}{logs}")
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{what}: not within {timeout:g} s")
            time.sleep(0.1)

    def cancel(self) -> None:
        """Terminate the run: delete the running task's pod (SIGTERM to its container); start nothing more."""
        self.cancelled = True
        if self.current_pod:
            self.cluster.store.mutate("pods", self.namespace, self.current_pod,
                                      lambda pod: pod["metadata"].setdefault("deletionTimestamp", now_rfc3339()))

    def timings(self) -> str:
        """One line per task that ran a pod: state and seconds."""
        return "\n".join(f"{name:<24} {r.state:<10} {r.seconds:6.1f} s" for name, r in self.results.items() if r.pod)

    def pod_log(self, task: str) -> str:
        """The current log of a task's pod (while it runs, too)."""
        pod = self.results[task].pod if task in self.results else self.current_pod
        runtime = self.cluster.kubelet.runtime((self.namespace, pod))
        return runtime.log.text if runtime is not None else ""

    def run(self) -> dict[str, TaskResult]:
        root = self.spec["root"]
        definitions = root.get("inputDefinitions", {}).get("parameters", {})
        unknown = set(self.arguments) - set(definitions)
        if unknown:
            raise ValueError(f"{self.name} has no parameters {sorted(unknown)}")
        parameters = {name: spec.get("defaultValue") for name, spec in definitions.items()}
        parameters.update(self.arguments)
        self._run_dag(root["dag"], parameters, {})
        return self.results

    # ---- the DAG

    def _context(self, task_name: str) -> dict[str, str]:
        return {"pipeline_job_uuid": self.run_id, "pipeline_job_name": f"{self.name}-run",
                "pipeline_job_resource_name": f"{self.name}-{self.run_id[:8]}", "pipeline_task_name": task_name,
                "pipeline_task_uuid": str(uuid.uuid4()), "pipeline_root": self.pipeline_root}

    def _run_dag(self, dag: dict, scope: dict[str, Any], scope_artifacts: dict[str, list[dict]]) -> bool:
        tasks, done = dag["tasks"], {}
        while len(done) < len(tasks):
            name = next(n for n, t in sorted(tasks.items()) if n not in done
                        and all(d in done for d in t.get("dependentTasks", [])))
            done[name] = self._run_task(name, tasks[name], scope, scope_artifacts, done)
            self.results[name] = done[name]
        return all(r.state in ("SUCCEEDED", "SKIPPED", "NOT_RUN") for r in done.values())

    def _run_task(self, name: str, task: dict, scope: dict, scope_artifacts: dict, done: dict) -> TaskResult:
        upstream = [done[d].state for d in task.get("dependentTasks", [])]
        always = task.get("triggerPolicy", {}).get("strategy") == "ALL_UPSTREAM_TASKS_COMPLETED"
        if not always and any(state in ("FAILED", "SKIPPED", "NOT_RUN", "CANCELLED") for state in upstream):
            return TaskResult(name, "NOT_RUN" if "NOT_RUN" in upstream else "SKIPPED")
        context = self._context(name)
        inputs = task.get("inputs", {})
        parameters = {key: kfp_ir.resolve_parameter(spec, scope, done, context)
                      for key, spec in inputs.get("parameters", {}).items()}
        artifacts = {key: self._artifact(spec, scope_artifacts, done) for key, spec in inputs.get("artifacts", {}).items()}
        condition = task.get("triggerPolicy", {}).get("condition")
        if condition and not _evaluate(condition, parameters):
            return TaskResult(name, "SKIPPED")
        component = self.spec["components"][task["componentRef"]["name"]]
        if "dag" in component:
            ok = self._run_dag(component["dag"], parameters, artifacts)
            failed = [r for r in self.results.values() if r.state == "FAILED" and r.error]
            return TaskResult(name, "CANCELLED" if self.cancelled else "SUCCEEDED" if ok else "FAILED",
                              error=failed[-1].error if failed and not ok else "")
        if name in self.skip:
            return TaskResult(name, "NOT_RUN")
        if self.cancelled:
            return TaskResult(name, "CANCELLED")
        attempts = 1 + (int(task.get("retryPolicy", {}).get("maxRetryCount", 0)) if self.retries else 0)
        for attempt in range(1, attempts + 1):
            result = self._run_container(name, task, component, parameters, artifacts, scope, done, context)
            result.attempts = attempt
            if result.state != "FAILED" or self.cancelled:
                break
        return result

    @staticmethod
    def _artifact(spec: dict, scope_artifacts: dict, done: dict) -> list[dict]:
        if "taskOutputArtifact" in spec:
            ref = spec["taskOutputArtifact"]
            return done[ref["producerTask"]].artifacts[ref["outputArtifactKey"]]
        return scope_artifacts[spec["componentInputArtifact"]]

    # ---- one container task

    def _run_container(self, name: str, task: dict, component: dict, parameters: dict, artifacts: dict,
                       scope: dict, done: dict, context: dict[str, str]) -> TaskResult:
        label = component["executorLabel"]
        container = self.spec["deploymentSpec"]["executors"][label]["container"]
        salt = uuid.uuid4().hex[:12]
        output_root = f"{self.pipeline_root}/{self.name}/{self.run_id}/{name}/{salt}"
        executor = kfp_ir.executor_input(component, parameters, artifacts, output_root)
        cache_key = ExecutionCache.key(component, executor) if self.cache is not None else ""
        if cache_key and task.get("cachingOptions", {}).get("enableCache") and cache_key in self.cache.entries:
            self.cache.hits.append(name)
            hit = self.cache.entries[cache_key]
            return TaskResult(name, "SUCCEEDED", pod=hit.pod, parameters=dict(hit.parameters),
                              artifacts=dict(hit.artifacts), executor_input=executor)
        env, pod_parts, not_emulated = kfp_ir.platform_pod_parts(
            self.platform.get(label, {}), lambda spec: kfp_ir.resolve_parameter(spec, scope, done, context))
        env += [{"name": "KFP_POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                {"name": "KFP_POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}}]
        pod_name = f"{self.name}-{self.run_id[:5]}-{name}"[:55].rstrip("-") + f"-{salt[:6]}"
        result = TaskResult(name, "RUNNING", pod=pod_name, executor_input=executor, not_emulated=not_emulated)
        pod = {
            "metadata": {"name": pod_name, "namespace": self.namespace,
                         "labels": {**pod_parts["metadata"]["labels"], "pipelines.kubeflow.org/v2_component": "true",
                                    "pipeline/runid": self.run_id},
                         "annotations": pod_parts["metadata"]["annotations"]},
            "spec": {**pod_parts["spec"], "serviceAccountName": self.service_account, "restartPolicy": "Never",
                     "containers": [{"name": "main", "image": container["image"],
                                     "command": kfp_ir.substitute_placeholders(container.get("command", []), executor),
                                     "args": kfp_ir.substitute_placeholders(container.get("args", []), executor),
                                     "env": env, "resources": kfp_ir.container_resources(container, parameters)}]},
            "status": {"phase": "Pending"}}
        key = (self.namespace, pod_name)
        self.cluster.kubelet.hooks[key] = PodHooks(
            before_start=lambda fs, log: self._download(executor, fs, log),
            after_exit=lambda fs, log, code: self._upload(component, executor, fs, log, code, result))
        self.current_pod = pod_name
        started = time.monotonic()
        self.cluster.store.create("pods", pod)
        self._wait(pod_name, result)
        result.seconds = time.monotonic() - started
        self.current_pod = ""
        runtime = self.cluster.kubelet.runtime(key)
        if runtime is not None:
            result.log, result.env = runtime.log.text, dict(runtime.env)
        if cache_key and result.state == "SUCCEEDED":
            self.cache.entries[cache_key] = result
        return result

    def _wait(self, pod_name: str, result: TaskResult) -> None:
        deadline, pending_since = time.monotonic() + self.task_timeout, time.monotonic()
        while True:
            try:
                pod = self.cluster.store.get("pods", self.namespace, pod_name)
            except NotFound:
                result.state, result.error = "FAILED", f"pod {pod_name} was deleted (the run was cancelled)"
                return
            phase = pod["status"].get("phase")
            if phase in FINAL:
                if result.state == "RUNNING":
                    result.state = "SUCCEEDED" if phase == "Succeeded" else "FAILED"
                if result.state == "FAILED" and not result.error:  # what the KFP UI shows: the log's last line
                    runtime = self.cluster.kubelet.runtime((self.namespace, pod_name))
                    lines = [line for line in (runtime.log.lines if runtime else []) if line.strip()]
                    result.error = lines[-1] if lines else _terminated_message(pod) or f"pod {pod_name} failed"
                return
            reason = pod_pending_reason(pod)
            if phase == "Running" or not reason:
                pending_since = time.monotonic()
            elif time.monotonic() - pending_since > self.pending_limit:
                result.state, result.error = "FAILED", f"pod {pod_name} pending: {reason}"
                return
            if time.monotonic() > deadline:
                result.state, result.error = "FAILED", f"pod {pod_name} still {phase} after {self.task_timeout:g} s"
                return
            time.sleep(0.2)

    # ---- the KFP launcher's work inside the pod

    def _download(self, executor: dict, fs: PodFilesystem, log: ContainerLog) -> None:
        for name, artifact_list in executor["inputs"].get("artifacts", {}).items():
            uri = artifact_list["artifacts"][0]["uri"]
            count = self.store.download(uri, fs.host_path(kfp_ir.local_path(uri)))
            log.append(f"launcher: downloaded input artifact {name!r} from {uri} ({count} file(s))")
        for artifact_list in executor["outputs"].get("artifacts", {}).values():
            fs.host_path(kfp_ir.local_path(artifact_list["artifacts"][0]["uri"])).parent.mkdir(parents=True,
                                                                                             exist_ok=True)
        for parameter in executor["outputs"].get("parameters", {}).values():
            fs.host_path(parameter["outputFile"]).parent.mkdir(parents=True, exist_ok=True)
        # The launcher runs as the container's user: what it downloads and creates belongs to that user.
        for mount in set(kfp_ir.MOUNTS.values()) | {"/tmp/"}:
            fs.make_owned(fs.host_path(mount))

    def _upload(self, component: dict, executor: dict, fs: PodFilesystem, log: ContainerLog, code: int,
                result: TaskResult) -> int:
        if code != 0:
            return code
        try:
            output_file = fs.host_path(executor["outputs"]["outputFile"])
            output = json.loads(output_file.read_text()) if output_file.is_file() else {}
            result.parameters = dict(output.get("parameterValues") or {})
            types = component.get("outputDefinitions", {}).get("parameters", {})
            for name, parameter in executor["outputs"].get("parameters", {}).items():
                if name not in result.parameters:
                    text = fs.host_path(parameter["outputFile"]).read_text()
                    result.parameters[name] = _typed(text, types[name]["parameterType"])
            for name, artifact_list in executor["outputs"].get("artifacts", {}).items():
                artifact = dict(artifact_list["artifacts"][0])
                produced = (output.get("artifacts", {}).get(name, {}).get("artifacts") or [{}])[0]
                artifact["uri"] = produced.get("uri") or artifact["uri"]
                artifact["metadata"] = {**artifact.get("metadata", {}), **(produced.get("metadata") or {})}
                source = fs.host_path(kfp_ir.local_path(artifact["uri"]))
                if source.exists():
                    count = self.store.upload(source, artifact["uri"])
                    log.append(f"launcher: uploaded output artifact {name!r} to {artifact['uri']} ({count} file(s))")
                else:
                    log.append(f"launcher: local filepath {kfp_ir.local_path(artifact['uri'])} does not exist")
                result.artifacts[name] = [artifact]
        except Exception as err:  # the launcher's failure fails the task, with its message in the log
            log.append(f"launcher: failed to collect outputs: {type(err).__name__}: {err}")
            result.error = str(err)
            return 1
        return 0


def pod_pending_reason(pod: dict) -> str:
    """Why a pod is not running: the scheduler's message or the container's waiting reason (else "")."""
    for condition in pod["status"].get("conditions", []):
        if condition["type"] == "PodScheduled" and condition["status"] == "False":
            return f"{condition.get('reason')}: {condition.get('message')}"
    for status in pod["status"].get("containerStatuses", []):
        waiting = status.get("state", {}).get("waiting")
        if waiting and waiting.get("reason") in WAITING_REASONS:
            return f"{waiting['reason']}: {waiting.get('message', '')}"
    return ""


def _terminated_message(pod: dict) -> str:
    """Why a container that never ran ended (`StartError: exec: "python3": executable file not found ...`)."""
    for status in pod["status"].get("containerStatuses", []):
        terminated = status.get("state", {}).get("terminated") or {}
        if terminated.get("message"):
            return f"{terminated.get('reason')}: {terminated['message']}"
    return ""


def _typed(text: str, parameter_type: str) -> Any:
    if parameter_type == "NUMBER_INTEGER":
        return int(text)
    if parameter_type == "NUMBER_DOUBLE":
        return float(text)
    if parameter_type == "BOOLEAN":
        return text.strip().lower() == "true"
    if parameter_type in ("STRUCT", "LIST"):
        return json.loads(text)
    return text


def _evaluate(condition: str, parameters: dict[str, Any]) -> bool:
    """A KFP trigger condition (a small CEL subset: comparisons, &&, ||, !) on the task's inputs."""
    expression = condition.replace("&&", " and ").replace("||", " or ")
    expression = expression.replace("!", " not ").replace(" not =", "!=")
    namespace = {"inputs": type("Inputs", (), {"parameter_values": parameters})(), "int": int, "double": float,
                 "string": str, "true": True, "false": False}
    return bool(eval(expression, {"__builtins__": {}}, namespace))  # noqa: S307 - the compiler's own expression
