"""A token for MLflow's `kubernetes` auth in the training pods, only where the platform names its audience."""

from __future__ import annotations

import json

import pytest

from components.launcher.kinds.pytorchjob.manifest import build_pytorchjob
from components.launcher.kinds.trainjob.request import build_trainjob_request
from components.launcher.stage_job import stage_spec
from components.stage_io import cluster_options
from tests.components.launcher.crd import pytorchjob_validator
from tests.components.launcher.pod_security import violations
from trainer.errors import LaunchError

PARAMS = {"launcher_mode": "kubernetes", "trainer_image": "", "num_nodes": 1, "gpus_per_node": 1}
PLATFORM = {"ALIGNFLOW_MLFLOW_TOKEN_AUDIENCE": "mlflow.kubeflow"}  # the chart's mlflow.tokenAudience
# What MLflow's kubernetes auth reads (mlflow/tracking/request_auth/kubernetes_request_auth_provider.py).
TOKEN_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


def spec_for(environ: dict, params: dict | None = None):
    return stage_spec("sft", "s3://b/run/sft.yaml", "run-1", "sft", cluster_options({**PARAMS, **(params or {})},
                                                                                     environ))


def master_pod(environ: dict) -> dict:
    return build_pytorchjob(spec_for(environ))["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]


def test_the_platforms_audience_gives_the_pods_a_projected_token_where_mlflow_reads_one():
    import kubernetes_validate

    pod = master_pod(PLATFORM)
    [volume] = [volume for volume in pod["volumes"] if volume["name"] == "mlflow-token"]
    token, namespace = volume["projected"]["sources"]
    assert token == {"serviceAccountToken": {"audience": "mlflow.kubeflow", "expirationSeconds": 3600,
                                             "path": "token"}}
    assert namespace["downwardAPI"]["items"] == [{"path": "namespace", "fieldRef": {"apiVersion": "v1",
                                                                                    "fieldPath": "metadata.namespace"}}]
    assert {"name": "mlflow-token", "mountPath": TOKEN_DIR, "readOnly": True} in pod["containers"][0]["volumeMounts"]
    assert pod["automountServiceAccountToken"] is False  # the account's own token (the API's audience) stays out
    assert violations(pod) == []  # a projected volume is allowed by the "restricted" standard
    kubernetes_validate.validate({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": pod},
                                 "1.30.0", strict=True)
    pytorchjob_validator().validate(build_pytorchjob(spec_for(PLATFORM)))


def test_without_the_setting_the_pods_get_no_token_at_all():
    pod = master_pod({})
    assert [volume["name"] for volume in pod["volumes"]] == ["dshm"]
    assert TOKEN_DIR not in json.dumps(pod)


def test_a_trainjobs_pods_get_the_same_volume_through_the_runtime_patch():
    request = build_trainjob_request(spec_for(PLATFORM))
    [patch] = [option for option in request.options if type(option).__name__ == "RuntimePatch"]
    pod = patch.training_runtime_spec.template.spec.replicated_jobs[0].template.spec.template.spec
    assert "mlflow-token" in [volume["name"] for volume in pod.volumes]
    assert {"name": "mlflow-token", "mountPath": TOKEN_DIR, "readOnly": True} in pod.containers[0].volume_mounts
    request = build_trainjob_request(spec_for({}))
    [patch] = [option for option in request.options if type(option).__name__ == "RuntimePatch"]
    pod = patch.training_runtime_spec.template.spec.replicated_jobs[0].template.spec.template.spec
    assert "mlflow-token" not in [volume["name"] for volume in pod.volumes]


def test_only_the_platform_decides_it_not_a_run():
    assert spec_for(PLATFORM, {"mlflow_token_audience": "kubernetes.default.svc"}).mlflow_token_audience == \
        "mlflow.kubeflow"  # a component parameter of that name is not taken
    with pytest.raises(LaunchError, match="scheduling has unknown key"):
        spec_for(PLATFORM, {"scheduling": {"mlflow_token_audience": "kubernetes.default.svc"}})
