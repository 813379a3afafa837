"""An emulated Kubernetes cluster on this machine: API server, scheduler, kubelet, and the training controllers.

`Cluster` starts the API server (`apiserver.py`) and one control loop that, every 0.1 s, lets the
Training Operator reconcile PyTorchJobs and Kubeflow Trainer reconcile TrainJobs
(`training_operator.py`, `trainer_controller.py`; each only where the cluster `serves` its API: a
cluster set up today has Kubeflow Trainer v2 and no PyTorchJob CRD), binds Pending pods to nodes
(`scheduler.py`; a pod that
fits nowhere stays Pending with `PodScheduled=False/Unschedulable` and a FailedScheduling event)
and lets the kubelet run, follow and stop containers (`kubelet.py`). Tests create what a
platform team would: nodes, a namespace's Secrets and ConfigMaps, service accounts with RBAC
(Role/ClusterRole and their bindings, applied from manifests such as the chart's).

`trainer_status=True` turns on Kubeflow Trainer's `TrainJobStatus` feature gate: its status server
(`trainer_status.py`) takes the progress a TrainJob's pods report into `status.trainerStatus`.
`api_versions()` is what the cluster's discovery tells Helm (`.Capabilities.APIVersions`).
"""

from __future__ import annotations

import base64
import secrets
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.cluster.apiserver import KUBEFLOW_TRAINER, TRAINING_OPERATOR, ApiServer
from tests.cluster.initializers import STANDIN_IMAGES
from tests.cluster.kubelet import Kubelet, record_event, set_condition
from tests.cluster.sandbox import ImageRoot
from tests.cluster.scheduler import choose_node, pod_requests
from tests.cluster.store import Store, now_rfc3339
from tests.cluster.tls import server_context, write_serving_certificate
from tests.cluster.trainer_controller import TrainerController
from tests.cluster.trainer_status import TrainerStatusServer
from tests.cluster.training_operator import TrainingOperator

ADMIN = "kubernetes-admin"


def node(name: str, *, cpu: str = "8", memory: str = "32Gi", gpus: int = 0, labels: dict | None = None,
         taints: list[dict] | None = None, gpu_resource: str = "nvidia.com/gpu") -> dict:
    """A Node object with allocatable resources (GPUs as an extended resource), labels and taints."""
    allocatable = {"cpu": cpu, "memory": memory, "pods": "110"}
    if gpus:
        allocatable[gpu_resource] = str(gpus)
    return {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
            "spec": {"taints": taints or []},
            "status": {"allocatable": allocatable, "capacity": dict(allocatable),
                       "conditions": [{"type": "Ready", "status": "True"}]}}


class Cluster:
    """The whole emulated cluster; use as a context manager.

    Args:
        workdir: Where the pods' folders and the API's certificate go.
        nodes: Node objects (`node()`).
        images: Images the nodes can pull; None: any.
        image_users: image prefix -> (uid, gid, HOME) of the image's user.
        serves: The training APIs installed: `TRAINING_OPERATOR` (PyTorchJobs), `KUBEFLOW_TRAINER` (TrainJobs
            and runtimes), or both (the default).
    """

    def __init__(self, workdir: Path, nodes: list[dict], images: set[str] | None = None,
                 image_users: dict[str, tuple[int, int, str]] | None = None,
                 image_roots: dict[str, ImageRoot] | None = None,
                 serves: frozenset[str] = TRAINING_OPERATOR | KUBEFLOW_TRAINER, trainer_status: bool = False,
                 trainer_release: str = "") -> None:
        self.workdir = workdir
        self.store = Store()
        cert, key = write_serving_certificate(workdir / "pki")
        self.ca_pem = cert.read_bytes()
        self.ca_path = cert
        self.api = ApiServer(self.store, server_context(cert, key), serves=serves)
        self.api.trainer_release = trainer_release  # "trainer-v2.4": Kubeflow Trainer v2.4's CRDs and rules
        self.kubelet = Kubelet(self.store, workdir / "pods", self.api.port, self.ca_pem, self.issue_token, images)
        self.kubelet.image_users = dict(image_users or {})
        self.kubelet.image_roots = dict(image_roots or {})
        self.kubelet.image_envs = dict(STANDIN_IMAGES)  # Kubeflow Trainer's initializer images (initializers.py)
        self.api.log_source = self.kubelet.log
        self.operator = TrainingOperator(self.store, self.kubelet)
        self.trainer = TrainerController(self.store, self.kubelet)
        self.trainer_status = TrainerStatusServer(self.store, server_context(cert, key), self.ca_pem) \
            if trainer_status else None
        self.trainer.status_server = self.trainer_status
        self.kubelet.issue_audience_token = self.trainer_status.issue if self.trainer_status else None
        self.api.admission["trainjobs"] = self.trainer.admit
        self.admin_token = secrets.token_hex(16)
        self.api.authorizer.add_token(self.admin_token, ADMIN)
        self.api.authorizer.grant(ADMIN, [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}])
        self.roles: dict[tuple[str, str], list[dict]] = {}
        for item in nodes:
            self.store.create("nodes", item)
        if "trainjobs" in self.api.serves:  # what a Kubeflow Trainer install publishes (the SDK reads it)
            self.store.create("configmaps", {"metadata": {"name": "kubeflow-trainer-public",
                                                          "namespace": "kubeflow-system"},
                                             "data": {"kubeflow_trainer_version": "v2.3.0"}})
        self._stop = threading.Event()
        self._loop = threading.Thread(target=self._control_loop, daemon=True, name="control-loop")
        self.errors: list[str] = []

    def __enter__(self) -> Cluster:
        self.api.start()
        if self.trainer_status is not None:
            self.trainer_status.start()
        self._loop.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._loop.join(timeout=10)
        self.kubelet.stop_all()
        self.api.stop()
        if self.trainer_status is not None:
            self.trainer_status.stop()

    # ---- what a platform team sets up

    def api_versions(self) -> list[str]:
        """`group/version` and `group/version/Kind` of every custom resource served (Helm's capabilities)."""
        from tests.cluster.apiserver import CUSTOM_RESOURCES, RESOURCES

        served = [RESOURCES[name] for name in sorted(CUSTOM_RESOURCES) if self.api.is_served(name)]
        return sorted({f"{group}/{version}" for group, _, _, version in served}
                      | {f"{group}/{version}/{kind}" for group, _, kind, version in served})

    def issue_token(self, namespace: str, account: str) -> str:
        token = secrets.token_hex(16)
        self.api.authorizer.add_token(token, f"system:serviceaccount:{namespace}:{account}")
        return token

    def create_namespace_objects(self, namespace: str, *, secrets_: dict[str, dict[str, str]] | None = None,
                                 config_maps: dict[str, dict[str, str]] | None = None) -> None:
        for name, data in (secrets_ or {}).items():
            self.store.create("secrets", {"metadata": {"name": name, "namespace": namespace}, "type": "Opaque",
                                          "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}})
        for name, data in (config_maps or {}).items():
            self.store.create("configmaps", {"metadata": {"name": name, "namespace": namespace}, "data": data})

    def apply(self, manifest: dict, namespace: str) -> None:
        """Create a manifest the way `kubectl apply` would for a new object (RBAC kinds become grants)."""
        kind = manifest["kind"]
        meta = {**manifest["metadata"], "namespace": manifest["metadata"].get("namespace", namespace)}
        if kind in ("Role", "ClusterRole"):
            self.roles[(kind, meta["name"])] = manifest.get("rules", [])
        elif kind in ("RoleBinding", "ClusterRoleBinding"):
            rules = self.roles.get((manifest["roleRef"]["kind"], manifest["roleRef"]["name"]), [])
            scope = meta["namespace"] if kind == "RoleBinding" else "*"
            for subject in manifest.get("subjects", []):
                user = (f"system:serviceaccount:{subject.get('namespace', meta['namespace'])}:{subject['name']}"
                        if subject["kind"] == "ServiceAccount" else subject["name"])
                self.api.authorizer.grant(user, rules, scope)
        elif kind in ("ConfigMap", "Secret", "ServiceAccount", "Service", "Pod"):
            self.store.create(kind.lower() + "s", {**manifest, "metadata": meta})
        elif kind in ("TrainingRuntime", "ClusterTrainingRuntime"):
            resource = kind.lower() + "s"
            if not self.api.is_served(resource):  # what `kubectl apply` / `helm install` answer without the CRD
                raise ValueError(f'no matches for kind "{kind}" in version "{manifest["apiVersion"]}"')
            if kind == "ClusterTrainingRuntime":
                meta.pop("namespace")
            errors, pruned = self.api.validate(resource, manifest)
            if errors or pruned:
                raise ValueError(f"{kind} {meta['name']} is invalid: {errors + pruned}")
            self.store.create(resource, {**manifest, "metadata": meta})
        else:
            raise ValueError(f"the emulated cluster does not apply {kind}")

    def client(self, token: str | None = None) -> Any:
        """A `kubernetes` ApiClient as the cluster admin (kubectl), or with a given token."""
        from kubernetes import client

        configuration = client.Configuration(host=self.api.url)
        configuration.ssl_ca_cert = str(self.ca_path)
        configuration.api_key = {"authorization": f"Bearer {token or self.admin_token}"}
        return client.ApiClient(configuration)

    def evict(self, namespace: str, pod: str) -> None:
        """What the eviction API does (a node drain, a preemption): the pod's DisruptionTarget condition, then a
        graceful delete (SIGTERM, the grace period, SIGKILL)."""
        def disrupt(p: dict) -> None:
            set_condition(p.setdefault("status", {}), "DisruptionTarget", "True", "EvictionByEvictionAPI",
                          "Eviction API: evicting")
            p["metadata"].setdefault("deletionTimestamp", now_rfc3339())

        self.store.mutate("pods", namespace, pod, disrupt)

    # ---- observing

    def wait_for(self, predicate: Callable[[], Any], timeout: float, what: str) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = predicate()
            if value:
                return value
            time.sleep(0.1)
        raise TimeoutError(f"{what}: not within {timeout:g} s")

    def jobs(self, namespace: str | None = None, resource: str = "pytorchjobs") -> list[dict]:
        """The PyTorchJobs (or, with `resource="trainjobs"`, the TrainJobs) in `namespace` (None: all)."""
        return self.store.list(resource, namespace)[0]

    def pods(self, namespace: str | None = None, label_selector: str = "") -> list[dict]:
        return self.store.list("pods", namespace, label_selector)[0]

    def events(self, namespace: str | None = None) -> list[dict]:
        return self.store.list("events", namespace)[0]

    # ---- the control plane

    def _control_loop(self) -> None:
        while not self._stop.is_set():
            for step in (self.operator.sync, self.trainer.sync, self._schedule, self.kubelet.sync):
                try:
                    step()
                except Exception as err:  # a bug in an emulator must show, not hang the test
                    self.errors.append(f"{step.__qualname__}: {type(err).__name__}: {err}")
            self._stop.wait(0.1)

    def _schedule(self) -> None:
        nodes, _ = self.store.list("nodes")
        pods, _ = self.store.list("pods")
        used: dict[str, dict[str, float]] = {}
        for pod in pods:
            if pod["spec"].get("nodeName") and pod["status"].get("phase") not in ("Succeeded", "Failed"):
                bucket = used.setdefault(pod["spec"]["nodeName"], {})
                for name, amount in pod_requests(pod).items():
                    bucket[name] = bucket.get(name, 0.0) + amount
        for pod in pods:
            if pod["spec"].get("nodeName") or pod["metadata"].get("deletionTimestamp"):
                continue
            namespace, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
            chosen, message = choose_node(pod, nodes, used)
            if chosen is None:
                def unschedulable(p: dict, message: str = message) -> None:
                    set_condition(p.setdefault("status", {}), "PodScheduled", "False", "Unschedulable", message)
                    p["status"]["phase"] = "Pending"

                before = self.store.get("pods", namespace, name)
                self.store.mutate("pods", namespace, name, unschedulable)
                conditions = before["status"].get("conditions", [])
                if not any(c["type"] == "PodScheduled" and c.get("message") == message for c in conditions):
                    record_event(self.store, namespace, name, "Warning", "FailedScheduling", message,
                                 "default-scheduler")
                continue

            def bind(p: dict, chosen: str = chosen) -> None:
                p["spec"]["nodeName"] = chosen
                set_condition(p.setdefault("status", {}), "PodScheduled", "True")

            self.store.mutate("pods", namespace, name, bind)
            bucket = used.setdefault(chosen, {})
            for resource, amount in pod_requests(pod).items():
                bucket[resource] = bucket.get(resource, 0.0) + amount
