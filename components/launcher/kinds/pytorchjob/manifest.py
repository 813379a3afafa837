"""Build a `kubeflow.org/v1` PyTorchJob from a stage spec, checking what the CRD schema does not.

Every replica runs `python -m trainer.launch -m trainer <stage> --config <uri>` (torchrun, exiting
143 rather than 1 when preempted: see `trainer/launch.py`) in a container named `pytorch` (the
Training Operator requires that name). torchrun takes its topology from the `PET_*` variables the
operator injects, which is why the command carries no `--nnodes`/`--nproc_per_node` of its own.

- One node: a single Master replica (static rendezvous on itself).
- More nodes: `num_nodes` Worker replicas and an `elasticPolicy` with the c10d rendezvous backend
  (`minReplicas = maxReplicas = num_nodes`, `maxRestarts`). The operator points every worker at a
  rendezvous hosted by worker-0 (`PET_RDZV_ENDPOINT`, `PET_NNODES=n:n`), so a worker pod that the
  kubelet restarts after a failure rejoins the group, and the others restart their processes from
  the last checkpoint, instead of the whole job failing as it would with a static master/worker
  rendezvous. The operator's webhook requires Worker replicas when an elastic policy is set.

The pod itself (resources, placement, security context) is built in `pod/template.py`; the value
checks are in `pod/checks.py`.
"""

from __future__ import annotations

from components.launcher.kinds.pytorchjob.api import API_VERSION, KIND
from components.launcher.pod.checks import check_spec
from components.launcher.pod.spec import STAGES, JobSpec, job_labels
from components.launcher.pod.template import pod_template


def is_elastic(spec: JobSpec) -> bool:
    return spec.num_nodes > 1


def _replica(spec: JobSpec, replicas: int, extra_env: list[dict] | None = None) -> dict:
    return {"replicas": replicas, "restartPolicy": spec.restart_policy, "template": pod_template(spec, extra_env)}


def _run_policy(spec: JobSpec) -> dict:
    policy: dict = {"backoffLimit": spec.backoff_limit, "cleanPodPolicy": spec.clean_pod_policy}
    if spec.active_deadline_seconds is not None:
        policy["activeDeadlineSeconds"] = spec.active_deadline_seconds
    if spec.ttl_seconds_after_finished is not None:
        policy["ttlSecondsAfterFinished"] = spec.ttl_seconds_after_finished
    return policy


def build_pytorchjob(spec: JobSpec) -> dict:
    """The PyTorchJob manifest for `spec` (checked first; raises LaunchError naming every problem)."""
    check_spec(spec, STAGES, kind=KIND)
    job_spec: dict = {"nprocPerNode": str(spec.nproc_per_node), "runPolicy": _run_policy(spec)}
    if is_elastic(spec):
        # Without a Master replica the operator does not pass nprocPerNode on as PET_NPROC_PER_NODE.
        # With the rendezvous' TCPStore shared with the workers (torch's default since 2.4), a surviving rank-0
        # agent keeps the previous round's MASTER_ADDR/PORT and never publishes them for the next round, so a
        # restarted worker's agent waits for them until it times out and the job cannot rejoin
        # (pytorch/pytorch#135712): each round then gets its own store.
        extra = [{"name": "PET_NPROC_PER_NODE", "value": str(spec.nproc_per_node)},
                 {"name": "TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "value": "1"}]
        job_spec["pytorchReplicaSpecs"] = {"Worker": _replica(spec, spec.num_nodes, extra)}
        job_spec["elasticPolicy"] = {"rdzvBackend": "c10d", "rdzvId": spec.name, "minReplicas": spec.num_nodes,
                                     "maxReplicas": spec.num_nodes, "maxRestarts": spec.max_restarts}
    else:
        job_spec["pytorchReplicaSpecs"] = {"Master": _replica(spec, 1)}
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": spec.name, "namespace": spec.namespace, "labels": job_labels(spec)},
        "spec": job_spec,
    }
