"""The service-account token a training pod shows MLflow, only where the platform names its audience.

KFP 2.17's MLflow integration defaults to `kubernetes` auth. MLflow's client for that mode
(`MLFLOW_TRACKING_AUTH=kubernetes`, or `kubernetes-namespaced` with workspaces) sends `Authorization: Bearer <token>`
read from `/var/run/secrets/kubernetes.io/serviceaccount/token`, read again each minute, and the workspace from
`MLFLOW_WORKSPACE`, else the `namespace` file beside the token (mlflow/mlflow
`mlflow/tracking/request_auth/kubernetes_request_auth_provider.py`). It has no setting for another path.

The pods mount no token of their own (`automountServiceAccountToken: false`: the trainer never talks to the
Kubernetes API). Where the platform sets `mlflow_token_audience` (`ALIGNFLOW_MLFLOW_TOKEN_AUDIENCE`, the chart's
`mlflow.tokenAudience`), they get a projected volume at that path instead: a token of the pods' ServiceAccount for
that audience alone, which the kubelet renews before it expires, and the pod's namespace. The Kubernetes API
refuses a token whose audience is not its own, so an audience only MLflow accepts keeps the pods off the API.

The token exists only in the pod's volume: the manifest names the audience, never a token, and nothing here reads
it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from components.launcher.pod.spec import JobSpec

MLFLOW_TOKEN_VOLUME = "mlflow-token"
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"  # where MLflow's kubernetes auth looks
TOKEN_SECONDS = 3600  # the kubelet renews a projected token at 80% of its life; MLflow reads it again each minute


def mlflow_token_volumes(spec: JobSpec) -> list[dict]:
    """The projected token volume where the platform enables one, else none."""
    if not spec.mlflow_token_audience:
        return []
    token = {"serviceAccountToken": {"audience": spec.mlflow_token_audience, "expirationSeconds": TOKEN_SECONDS,
                                     "path": "token"}}
    namespace = {"downwardAPI": {"items": [{"path": "namespace",
                                            "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}
    return [{"name": MLFLOW_TOKEN_VOLUME, "projected": {"sources": [token, namespace]}}]


def mlflow_token_mounts(spec: JobSpec) -> list[dict]:
    """The training container's mount of that volume, read-only, where MLflow reads a token; else none."""
    if not spec.mlflow_token_audience:
        return []
    return [{"name": MLFLOW_TOKEN_VOLUME, "mountPath": SERVICE_ACCOUNT_DIR, "readOnly": True}]
