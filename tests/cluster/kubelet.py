"""The emulated nodes' kubelet: runs a scheduled pod's container as a sandboxed local process.

For each pod bound to a node it pulls the image (an image the cluster does not have stays in
`ErrImagePull`/`ImagePullBackOff`), resolves the container's environment from the API (`value`,
`secretKeyRef`, `configMapKeyRef`, `fieldRef`, `envFrom`; a missing Secret, ConfigMap or key is
`CreateContainerConfigError` with the kubelet's message), adds what every container gets
(`KUBERNETES_SERVICE_HOST/PORT`, `HOSTNAME`, the image's PATH and HOME), mounts the service
account token, and runs exactly `command + args` in the pod's own filesystem (`sandbox.py`) from
an empty working directory, with the pod's name as its hostname. It reports container states and pod
phase as a kubelet does, restarts per `restartPolicy` (in the same pod, counting `restartCount`, after
a CrashLoopBackOff back-off that starts at 1 s instead of the kubelet's 10 s and doubles), keeps each container's log for `pods/log`, and stops the process (SIGTERM,
then SIGKILL after the grace period) when the pod is deleted. A SIGKILL reaches every descendant of the
container's process, as a runtime kills a container's cgroup (`kill_container` plays a node loss).

Secret volumes mounted under the pod's own `/run` (`/var/run/...`) get the Secret's keys as files (`volumes.py`);
a Secret that does not exist keeps the pod ContainerCreating with the kubelet's FailedMount event, unless the volume
is optional. A pod's `hostname` (and its
`subdomain`, as a Job's indexed pods have) is the container's hostname. A deleted pod that still has
finalizers (a Job's pods: `batch.kubernetes.io/job-tracking`) keeps its final status, Failed with its
container's exit code (143 after SIGTERM), until the controller that owns it removes them.

A `persistentVolumeClaim` volume is a folder of this machine per claim (`volumes.py`). An image the cluster stands in for (`image_envs`: a
prefix -> environment, e.g. the PYTHONPATH of a stand-in program) gets that environment under the container's.

One container per pod (the first); init containers, probes and volumes other than the service
account, Secrets and claims are not emulated (an emptyDir at /dev/shm is this machine's /dev/shm).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.cluster.projected import ProjectedVolumeError, mount_projected_volumes
from tests.cluster.sandbox import ImageRoot, PodFilesystem
from tests.cluster.store import NotFound, Store, now_rfc3339
from tests.cluster.volumes import VolumeError, claim_volumes, mount_secret_volumes, secret_data

logger = logging.getLogger(__name__)
IMAGE_PATH = f"{Path(sys.executable).parent}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# A pod's grace period is honoured up to this long (the pods here ask for 30 s): a preempted trainer's stopping
# checkpoint and exit take a few seconds, longer on a busy machine; a process that ignores SIGTERM costs this much.
MAX_GRACE_SECONDS = 20.0
# The kubelet's restart back-off starts at 10 s and doubles up to 5 min; here 1 s, doubling up to 10 s.
RESTART_BACKOFF_SECONDS = 1.0
MAX_RESTART_BACKOFF_SECONDS = 10.0


class ConfigError(Exception):
    """The container cannot be configured (CreateContainerConfigError)."""


@dataclass
class ContainerLog:
    lines: list[str] = field(default_factory=list)
    stamps: list[float] = field(default_factory=list)  # when each line was written (time.time())
    finished: bool = False
    changed: threading.Condition = field(default_factory=threading.Condition)

    def append(self, line: str) -> None:
        with self.changed:
            self.lines.append(line)
            self.stamps.append(time.time())
            self.changed.notify_all()

    def finish(self) -> None:
        with self.changed:
            self.finished = True
            self.changed.notify_all()

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


@dataclass
class PodHooks:
    """What the KFP launcher does inside a component pod around the user command (download, upload)."""

    before_start: Callable[[PodFilesystem, ContainerLog], None] | None = None
    after_exit: Callable[[PodFilesystem, ContainerLog, int], int] | None = None


@dataclass
class Runtime:
    fs: PodFilesystem
    log: ContainerLog
    process: subprocess.Popen | None = None
    reader: threading.Thread | None = None
    started_at: str = ""
    restarts: int = 0
    restart_at: float = 0.0  # time.monotonic() when the back-off of a restart ends
    env: dict[str, str] = field(default_factory=dict)


def resolve_env(store: Store, pod: dict, container: dict) -> dict[str, str]:
    """The container's declared environment, resolved as the kubelet does. Raises ConfigError."""
    namespace = pod["metadata"]["namespace"]
    env: dict[str, str] = {}

    def lookup(kind: str, name: str, optional: bool) -> dict | None:
        try:
            return store.get(kind, namespace, name)
        except NotFound:
            if optional:
                return None
            raise ConfigError(f'{kind[:-1] if kind == "secrets" else "configmap"} "{name}" not found') from None

    for source in container.get("envFrom") or []:
        for kind, ref in (("secrets", source.get("secretRef")), ("configmaps", source.get("configMapRef"))):
            if ref:
                obj = lookup(kind, ref["name"], ref.get("optional", False)) or {}
                for key, value in secret_data(kind, obj).items():
                    env[source.get("prefix", "") + key] = value
    for item in container.get("env") or []:
        if "value" in item or "valueFrom" not in item:
            env[item["name"]] = str(item.get("value", ""))
            continue
        source = item["valueFrom"]
        for kind, ref_key in (("secrets", "secretKeyRef"), ("configmaps", "configMapKeyRef")):
            if ref_key in source:
                ref = source[ref_key]
                obj = lookup(kind, ref["name"], ref.get("optional", False))
                data = secret_data(kind, obj) if obj is not None else {}
                if ref["key"] not in data:
                    if ref.get("optional") or obj is None:
                        break
                    what = "Secret" if kind == "secrets" else "ConfigMap"
                    raise ConfigError(f"couldn't find key {ref['key']} in {what} {namespace}/{ref['name']}")
                env[item["name"]] = data[ref["key"]]
        if "fieldRef" in source:
            env[item["name"]] = _field_value(pod, source["fieldRef"]["fieldPath"])
    return env


def _field_value(pod: dict, path: str) -> str:
    meta = pod["metadata"]
    simple = {"metadata.name": meta["name"], "metadata.namespace": meta["namespace"], "metadata.uid": meta["uid"],
              "spec.nodeName": pod["spec"].get("nodeName", ""),
              "spec.serviceAccountName": pod["spec"].get("serviceAccountName", "default"),
              "status.podIP": "127.0.0.1", "status.hostIP": "127.0.0.1"}
    if path in simple:
        return simple[path]
    for field_name in ("labels", "annotations"):
        if path.startswith(f"metadata.{field_name}['"):
            return (meta.get(field_name) or {}).get(path[len(f"metadata.{field_name}['"):-2], "")
    raise ConfigError(f"fieldRef {path} is not emulated")


class Kubelet:
    """Runs the containers of every node. `sync()` is called by the cluster's control loop."""

    def __init__(self, store: Store, pods_dir: Path, api_port: int, ca_pem: bytes,
                 issue_token: Callable[[str, str], str], images: set[str] | None = None) -> None:
        self.store = store
        self.pods_dir = pods_dir
        self.api_port = api_port
        self.ca_pem = ca_pem
        self.issue_token = issue_token
        self.images = images  # None: every image can be pulled
        # image prefix -> (uid, gid, HOME) of the image's USER; other images run as root
        self.image_users: dict[str, tuple[int, int, str]] = {}
        # image -> its built filesystem and config (`make test-images`); other images run on this machine's root
        self.image_roots: dict[str, ImageRoot] = {}
        # image prefix -> environment of an image the cluster stands in for (a stand-in program's PYTHONPATH)
        self.image_envs: dict[str, dict[str, str]] = {}
        self.runtimes: dict[tuple[str, str], Runtime] = {}
        self.removed: dict[tuple[str, str], Runtime] = {}  # runtimes of deleted pods, for their logs
        self.hooks: dict[tuple[str, str], PodHooks] = {}
        self.issue_audience_token: Callable[[str, str, str], str] | None = None  # projected tokens (projected.py)
        self.hosts: dict[tuple[str, str], dict[str, str]] = {}  # extra /etc/hosts entries per pod
        self.lock = threading.RLock()

    def runtime(self, key: tuple[str, str]) -> Runtime | None:
        """A pod's runtime, also after the pod was deleted."""
        return self.runtimes.get(key) or self.removed.get(key)

    def log(self, namespace: str, name: str, container: str | None) -> ContainerLog:
        pod = self.store.get("pods", namespace, name)
        names = [c["name"] for c in pod["spec"]["containers"]]
        if container is not None and container not in names:
            raise LookupError(f"container {container} is not valid for pod {name}")
        runtime = self.runtimes.get((namespace, name))
        if runtime is None or runtime.process is None and not runtime.log.lines:
            raise LookupError(f'container "{names[0]}" in pod "{name}" is waiting to start: ContainerCreating')
        return runtime.log

    def sync(self) -> None:
        with self.lock:
            pods, _ = self.store.list("pods")
            for pod in pods:
                key = (pod["metadata"]["namespace"], pod["metadata"]["name"])
                if pod["metadata"].get("deletionTimestamp"):
                    self._remove(key, pod)
                elif pod["spec"].get("nodeName") and pod["status"].get("phase") not in ("Succeeded", "Failed"):
                    self._run(key, pod)

    def stop_all(self) -> None:
        with self.lock:
            for runtime in self.runtimes.values():
                self._stop(runtime, grace=1.0)

    # ---- lifecycle

    def _run(self, key: tuple[str, str], pod: dict) -> None:
        runtime = self.runtimes.get(key)
        if runtime is None:
            image = self.image_roots.get(pod["spec"]["containers"][0].get("image", ""))
            hostname = pod["spec"].get("hostname") or key[1]
            volumes, read_only = claim_volumes(pod, self.pods_dir / "claims")
            runtime = self.runtimes[key] = Runtime(PodFilesystem(self.pods_dir / f"{key[0]}_{key[1]}",
                                                                 self.hosts.get(key), hostname=hostname, image=image,
                                                                 volumes=volumes, read_only=read_only),
                                                   ContainerLog())
        if runtime.process is None:
            if time.monotonic() >= runtime.restart_at:
                self._start(key, pod, runtime)
            return
        code = runtime.process.poll()
        if code is None:
            return
        runtime.reader.join(timeout=5)
        code = 128 - code if code < 0 else code  # killed by a signal: 128 + signal, as a container runtime reports
        hooks = self.hooks.get(key)
        if hooks and hooks.after_exit:
            code = hooks.after_exit(runtime.fs, runtime.log, code)
        self._exited(key, pod, runtime, {"exitCode": code, "reason": "Completed" if code == 0 else "Error",
                                         "startedAt": runtime.started_at, "finishedAt": now_rfc3339()})

    def _exited(self, key: tuple[str, str], pod: dict, runtime: Runtime, terminated: dict) -> None:
        """Restart the container per the pod's restartPolicy, or end the pod with `terminated` as its state."""
        code = terminated["exitCode"]
        policy = pod["spec"].get("restartPolicy", "Always")
        restart = policy == "Always" or (policy == "OnFailure" and code != 0)
        if restart:
            runtime.process, runtime.restarts = None, runtime.restarts + 1
            backoff = min(RESTART_BACKOFF_SECONDS * 2 ** (runtime.restarts - 1), MAX_RESTART_BACKOFF_SECONDS)
            runtime.restart_at = time.monotonic() + backoff
            self._set_status(key, "Running", {"waiting": {"reason": "CrashLoopBackOff",
                                                          "message": f"back-off restarting failed container, exit code {code}"}},
                             last=terminated)
            return
        runtime.log.finish()
        self._set_status(key, "Succeeded" if code == 0 else "Failed", {"terminated": terminated})

    def _start(self, key: tuple[str, str], pod: dict, runtime: Runtime) -> None:
        container = pod["spec"]["containers"][0]
        image = container.get("image", "")
        if self.images is not None and image not in self.images:
            self._set_status(key, "Pending", {"waiting": {
                "reason": "ImagePullBackOff", "message": f'Back-off pulling image "{image}"'}},
                event=("Failed", f'Failed to pull image "{image}": rpc error: code = NotFound desc = failed to '
                                 f'pull and unpack image "{image}": not found'))
            return
        try:
            declared = resolve_env(self.store, pod, container)
        except ConfigError as err:
            self._set_status(key, "Pending", {"waiting": {"reason": "CreateContainerConfigError", "message": str(err)}},
                             event=("Failed", f"Error: {err}"))
            return
        try:
            uid, gid, home = self._user(pod, container)
        except ConfigError as err:
            self._set_status(key, "Pending", {"waiting": {"reason": "CreateContainerConfigError", "message": str(err)}},
                             event=("Failed", f"Error: {err}"))
            return
        runtime.fs.run_as(uid, gid, home)
        try:
            mount_secret_volumes(self.store, pod, container, runtime.fs)
            mount_projected_volumes(self.store, pod, container, runtime.fs, self.issue_audience_token)
        except (VolumeError, ProjectedVolumeError) as err:
            self._set_status(key, "Pending", {"waiting": {"reason": "ContainerCreating"}},
                             event=("FailedMount", str(err)))
            return
        account = pod["spec"].get("serviceAccountName") or "default"
        if pod["spec"].get("automountServiceAccountToken", True):
            runtime.fs.mount_service_account(key[0], self.issue_token(key[0], account), self.ca_pem)
        env = {**self.image_env(image), "HOME": home, "HOSTNAME": key[1],
               "KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(self.api_port),
               "KUBERNETES_SERVICE_PORT_HTTPS": str(self.api_port),
               "KUBERNETES_PORT": f"tcp://127.0.0.1:{self.api_port}", **declared}
        runtime.env = env
        hooks = self.hooks.get(key)
        argv = [*(container.get("command") or []), *(container.get("args") or [])]
        try:
            if hooks and hooks.before_start:
                hooks.before_start(runtime.fs, runtime.log)
        except Exception as err:  # the KFP launcher's own failure: the container fails with its message
            runtime.log.append(f"{type(err).__name__}: {err}")
            argv = ["sh", "-c", "exit 1"]
        if argv and runtime.fs.executable(argv[0], env.get("PATH", "")) is None:
            # What containerd answers when the image has no such program: the container never starts.
            message = (f"failed to create containerd task: failed to create shim task: OCI runtime create failed: "
                       f"runc create failed: unable to start container process: exec: \"{argv[0]}\": executable file "
                       "not found in $PATH: unknown")
            runtime.started_at = now_rfc3339()
            record_event(self.store, key[0], key[1], "Warning", "Failed", f"Error: {message}", "kubelet")
            self._exited(key, pod, runtime, {"exitCode": 128, "reason": "StartError", "message": message,
                                             "startedAt": runtime.started_at, "finishedAt": runtime.started_at})
            return
        command, outer_env = runtime.fs.command(argv, env)
        runtime.process = subprocess.Popen(command, env=outer_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                           text=True, errors="replace", start_new_session=True)
        runtime.reader = threading.Thread(target=self._pump, args=(runtime,), daemon=True)
        runtime.reader.start()
        runtime.started_at = now_rfc3339()
        self._set_status(key, "Running", {"running": {"startedAt": runtime.started_at}}, ready=True)

    def image_env(self, image: str) -> dict[str, str]:
        """The environment an image gives its containers (a built image's ENV; else this machine's PATH, and a
        stood-in image's own variables)."""
        if image in self.image_roots:
            return dict(self.image_roots[image].env)
        own = next((env for prefix, env in self.image_envs.items() if image.startswith(prefix)), {})
        return {"PATH": IMAGE_PATH, "LANG": "C.UTF-8", **own}

    def _user(self, pod: dict, container: dict) -> tuple[int, int, str]:
        """(uid, gid, HOME): the image's user unless the pod or container securityContext says otherwise."""
        image = container.get("image", "")
        uid, gid, home = self.image_roots[image].user if image in self.image_roots else next(
            (user for prefix, user in self.image_users.items() if image.startswith(prefix)), (0, 0, "/home/root"))
        merged = {**(pod["spec"].get("securityContext") or {}), **(container.get("securityContext") or {})}
        uid, gid = int(merged.get("runAsUser", uid)), int(merged.get("runAsGroup", gid))
        if merged.get("runAsNonRoot") and uid == 0:
            raise ConfigError(f"container has runAsNonRoot and image will run as root (pod: "
                              f"\"{pod['metadata']['name']}_{pod['metadata']['namespace']}\", container: {container['name']})")
        return uid, gid, home

    @staticmethod
    def _pump(runtime: Runtime) -> None:
        for line in runtime.process.stdout:
            runtime.log.append(line.rstrip("\n"))

    def kill_container(self, namespace: str, name: str) -> None:
        """SIGKILL every process of a pod's running container, as a node loss or an OOM kill does."""
        with self.lock:
            runtime = self.runtimes[(namespace, name)]
            _signal_container(runtime.process, signal.SIGKILL)

    def _stop(self, runtime: Runtime, grace: float) -> None:
        process = runtime.process
        if process is None or process.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
            try:
                if sig == signal.SIGKILL:
                    _signal_container(process, sig)
                else:
                    os.killpg(process.pid, sig)
            except ProcessLookupError:
                return
            try:
                process.wait(timeout=wait)
                return
            except subprocess.TimeoutExpired:
                continue

    def _remove(self, key: tuple[str, str], pod: dict) -> None:
        runtime = self.runtimes.pop(key, None)
        if runtime is not None:
            self.removed[key] = runtime
            grace = min(float(pod["spec"].get("terminationGracePeriodSeconds", 30)), MAX_GRACE_SECONDS)
            self._stop(runtime, grace)
            runtime.log.finish()
            if pod["metadata"].get("finalizers"):
                self._record_end(key, pod, runtime)
        if pod["metadata"].get("finalizers"):
            return  # the owner's controller removes its finalizer once it has seen how the pod ended
        try:
            self.store.delete("pods", *key)
        except NotFound:
            pass

    def _record_end(self, key: tuple[str, str], pod: dict, runtime: Runtime) -> None:
        """A stopped pod's final status: its container's exit code (143 when SIGTERM ended it)."""
        if pod["status"].get("phase") in ("Succeeded", "Failed") or runtime.process is None:
            if pod["status"].get("phase") not in ("Succeeded", "Failed"):
                self.store.mutate("pods", *key, lambda p: p["status"].update(phase="Failed"))
            return
        code = runtime.process.returncode
        code = 128 - code if code < 0 else code
        terminated = {"exitCode": code, "reason": "Completed" if code == 0 else "Error",
                      "startedAt": runtime.started_at, "finishedAt": now_rfc3339()}
        self.runtimes[key] = runtime  # _set_status reads it
        try:
            self._set_status(key, "Succeeded" if code == 0 else "Failed", {"terminated": terminated})
        finally:
            self.runtimes.pop(key, None)

    # ---- status

    def _set_status(self, key: tuple[str, str], phase: str, state: dict, *, last: dict | None = None,
                    ready: bool = False, event: tuple[str, str] | None = None) -> None:
        runtime = self.runtimes[key]
        changed = []

        def change(pod: dict) -> None:
            container = pod["spec"]["containers"][0]
            status = pod.setdefault("status", {})
            status["phase"] = phase
            status.setdefault("startTime", now_rfc3339())
            status.update(hostIP="127.0.0.1", podIP="127.0.0.1")
            container_status = {"name": container["name"], "image": container.get("image", ""),
                                "imageID": "", "ready": ready, "restartCount": runtime.restarts, "state": state,
                                "started": "running" in state}
            previous = (status.get("containerStatuses") or [{}])[0]
            if last:
                container_status["lastState"] = {"terminated": last}
            elif previous.get("lastState"):  # the previous container's end stays visible after a restart
                container_status["lastState"] = previous["lastState"]
            if previous.get("state") != state or previous.get("restartCount") != runtime.restarts:
                changed.append(True)
            status["containerStatuses"] = [container_status]
            set_condition(status, "Ready", "True" if ready else "False")

        self.store.mutate("pods", key[0], key[1], change)
        if event and changed:
            record_event(self.store, key[0], key[1], "Warning", event[0], event[1], "kubelet")


def _signal_container(process: subprocess.Popen, sig: int) -> None:
    """Signal a container's process group and every descendant, as a runtime kills a container's cgroup.

    Without cgroups a process that left the group (torchrun starts its workers in sessions of their
    own) would outlive the container; here it dies with it, as in a real pod.
    """
    import psutil

    try:
        descendants = psutil.Process(process.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        descendants = []
    try:
        os.killpg(process.pid, sig)
    except ProcessLookupError:
        pass
    for child in descendants:
        try:
            child.send_signal(sig)
        except psutil.NoSuchProcess:
            pass


def set_condition(status: dict, kind: str, value: str, reason: str = "", message: str = "") -> None:
    """Set a pod condition; its lastTransitionTime moves only when its status does."""
    conditions = status.setdefault("conditions", [])
    current = next((c for c in conditions if c["type"] == kind), None)
    if current is None:
        current = {"type": kind}
        conditions.append(current)
    if current.get("status") != value:
        current["lastTransitionTime"] = now_rfc3339()
    current["status"] = value
    for name, text in (("reason", reason), ("message", message)):
        if text:
            current[name] = text
        else:
            current.pop(name, None)


def record_event(store: Store, namespace: str, pod: str, kind: str, reason: str, message: str, component: str) -> None:
    """An Event about a pod, counted when the same reason and message repeat (as the event recorder does)."""
    name = f"{pod}.{abs(hash((reason, message))) % 10**8:08d}"
    stamp = now_rfc3339()
    existing = store.mutate("events", namespace, name, lambda event: event.update(count=event["count"] + 1,
                                                                                   lastTimestamp=stamp))
    if existing is None:
        store.create("events", {
            "metadata": {"name": name, "namespace": namespace},
            "involvedObject": {"kind": "Pod", "name": pod, "namespace": namespace},
            "reason": reason, "message": message, "type": kind, "count": 1, "firstTimestamp": stamp,
            "lastTimestamp": stamp, "source": {"component": component}})
