"""Shared helpers of the chart tests: render with the real Helm engine, and find the pods in the output."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import yaml

CHART = Path(__file__).parents[2] / "helm" / "alignflow"
RELEASE, NAMESPACE = "af", "ml"
KUBERNETES_VERSION = "1.30.0"

# Every pod-bearing template on at once, with the options that add containers, volumes and env.
EVERYTHING = {
    "mlflow": {"enabled": True, "backend": {"type": "postgres", "postgresSecret": "mlflow-db"}},
    "s3": {"credentialsSecret": "s3-credentials", "endpoint": "http://minio:9000"},
    "retrain": {"enabled": True, "mode": "cronJob", "params": {"source": "s3://alignflow/data"}},
    "kfp": {"multiUser": {"enabled": True}},
    "training": {"runtime": {"kind": "ClusterTrainingRuntime", "maxRestarts": 1}},
    "extraEnv": [{"name": "HTTPS_PROXY", "value": "http://proxy:3128"}],
    "extraVolumes": [{"name": "corp-ca", "configMap": {"name": "corp-ca"}}],
    "extraVolumeMounts": [{"name": "corp-ca", "mountPath": "/etc/ssl/corp", "readOnly": True}],
    "sandbox": {"enabled": True, "tokenSecret": "sandbox-token"},
}


# Value sets every chart test runs over (lint, strict validation, pod security).
OVERRIDES = {
    "defaults": {},
    "mlflow-sqlite-and-cron-retrain": {
        "mlflow": {"enabled": True}, "s3": {"credentialsSecret": "s3-credentials", "endpoint": "http://minio:9000"},
        "retrain": {"enabled": True, "mode": "cronJob", "params": {"source": "s3://alignflow/data"}},
        "gpu": {"nodeSelector": {"nvidia.com/gpu.present": "true"},
                "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]},
    },
    "mlflow-postgres-and-recurring-run": {
        "mlflow": {"enabled": True, "backend": {"type": "postgres", "postgresSecret": "mlflow-db"}},
        "s3": {"credentialsSecret": "s3-credentials"}, "retrain": {"enabled": True, "mode": "recurringRun"},
    },
    "pytorchjob-only": {"training": {"jobKind": "pytorchjob"}},
    "trainjob-with-an-existing-runtime": {"training": {"jobKind": "trainjob", "runtime": {"create": False}}},
    "external-mlflow-no-upload": {"mlflow": {"trackingUri": "http://mlflow.tools:5000"},
                                  "uploadPipelines": {"enabled": False}, "serviceAccount": {"create": False,
                                                                                            "name": "existing"}},
    "irsa-no-credentials-secret": {
        "serviceAccount": {"annotations": {"eks.amazonaws.com/role-arn": "arn:aws:iam::111122223333:role/af"}},
        "mlflow": {"enabled": True, "serviceAccount": {"annotations": {
            "eks.amazonaws.com/role-arn": "arn:aws:iam::111122223333:role/af-mlflow"}}},
        "retrain": {"enabled": True, "mode": "cronJob"},
    },
    "everything": EVERYTHING,
    "multi-user-kubeflow-policy": {
        "kfp": {"multiUser": {"enabled": True, "namespace": "team-a"}},
        "retrain": {"enabled": True, "mode": "recurringRun"},
        "policy": {"allowedTrainerImages": ["registry.corp/ml/"], "allowedSecrets": ["hf-token"],
                   "rewardFunctions": {"exact": "rewards.text:exact_match"},
                   "allowedRewardModulePrefixes": ["corp_rewards."]},
        "scheduling": {"priorityClassName": "training", "kueueQueue": "gpu-queue"},
    },
}

# What a cluster's discovery tells Helm (`.Capabilities.APIVersions`): group/version and group/version/Kind.
TRAINER_APIS = ("trainer.kubeflow.org/v1alpha1", "trainer.kubeflow.org/v1alpha1/TrainJob",
                "trainer.kubeflow.org/v1alpha1/TrainingRuntime", "trainer.kubeflow.org/v1alpha1/ClusterTrainingRuntime")
OPERATOR_APIS = ("kubeflow.org/v1", "kubeflow.org/v1/PyTorchJob")


def render(values: dict, *, upgrade_to: int | None = None,
           api_versions: tuple[str, ...] = TRAINER_APIS + OPERATOR_APIS, namespace: str = NAMESPACE) -> list[dict]:
    """The chart's manifests for `values`, as Helm would install them (release af in `namespace`), or
    upgrade them to revision `upgrade_to`, on a cluster serving `api_versions` (default: Trainer and Operator)."""
    import json

    import helm_python
    from helm_python import _native

    chart = helm_python.Chart.load(str(CHART))
    options = {"name": RELEASE, "namespace": namespace, "api_versions": list(api_versions)}
    if upgrade_to is None:
        options["is_install"] = True
    else:
        options.update(revision=upgrade_to, is_upgrade=True)
    # `Chart.render` has no parameter for the capabilities; the Helm engine underneath takes them (`api_versions`,
    # as `helm template --api-versions`), and checks values against the schema as `Chart.render` does.
    rendered = json.loads(_native.call_string("helm_render", chart._raw(), json.dumps(values), json.dumps(options)))
    return [doc for path, text in rendered.items() if path.endswith(".yaml")
            for doc in yaml.safe_load_all(text) if doc]


RUNTIME_KINDS = ("TrainingRuntime", "ClusterTrainingRuntime")


def pod_spec(document: dict) -> dict | None:
    """The pod spec inside a workload (Deployment, Job, CronJob, a training runtime's `node` job, ...), or None
    for other kinds."""
    spec = document.get("spec") or {}
    if document["kind"] == "Pod":
        return spec
    if document["kind"] == "CronJob":
        spec = spec["jobTemplate"]["spec"]
    if document["kind"] in RUNTIME_KINDS:  # a JobSet template: replicated jobs of Jobs of pods
        [node] = [job for job in spec["template"]["spec"]["replicatedJobs"] if job["name"] == "node"]
        spec = node["template"]["spec"]
    return (spec.get("template") or {}).get("spec")


def pods(documents: list[dict]) -> Iterator[tuple[str, dict]]:
    """(kind/name, pod spec) of every workload the chart itself runs (not the training runtime's job template,
    whose pods the launcher's TrainJobs create and configure)."""
    for document in documents:
        spec = pod_spec(document) if document["kind"] not in RUNTIME_KINDS else None
        if spec is not None:
            yield f"{document['kind']}/{document['metadata']['name']}", spec


def containers(spec: dict) -> list[dict]:
    """Init, regular and ephemeral containers of a pod spec."""
    return [*spec.get("initContainers", []), *spec["containers"], *spec.get("ephemeralContainers", [])]


def one(documents: list[dict], kind: str) -> dict:
    [document] = [d for d in documents if d["kind"] == kind]
    return document


def expand_kubelet_references(text: str, variables: dict[str, str]) -> str:
    """The kubelet's expansion of `$(NAME)` in args and env values (Kubernetes
    third_party/forked/golang/expansion/expand.go): `$$` is a literal `$`, `$(NAME)` of a defined variable
    is its value, anything else is kept as written."""
    out, checkpoint, cursor = [], 0, 0
    while cursor < len(text):
        if text[cursor] == "$" and cursor + 1 < len(text):
            out.append(text[checkpoint:cursor])
            rest = text[cursor + 1:]
            if rest[0] == "$":
                read, advance = "$", 1
            elif rest[0] == "(":
                closer = rest.find(")", 1)
                if closer == -1:
                    read, advance = "$(", 1
                else:
                    name = rest[1:closer]
                    read, advance = variables.get(name, f"$({name})"), closer + 1
            else:
                read, advance = "$" + rest[0], 1
            out.append(read)
            cursor += advance
            checkpoint = cursor + 1
        cursor += 1
    return "".join(out) + text[checkpoint:]
