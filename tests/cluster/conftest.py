"""Fixtures of the cluster-faithful tests: an S3 store, the emulated cluster set up as a platform team would.

The setup follows the cluster steps of docs/cluster.md: a namespace where KFP runs pipelines as a service
account, the chart installed (its defaults ConfigMap and launcher Role, and on a Kubeflow Trainer
cluster its TrainingRuntime, rendered by the real Helm engine from the values a platform team
writes), the S3 credentials Secret, and the pipeline compiled (what `alignflow compile` and the
chart's upload job produce) and run. A cluster serves one kind of training job (`KINDS`): Kubeflow
Trainer v2's TrainJobs (the default, a cluster set up today) or the Training Operator's PyTorchJobs.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.cluster import kfp_ir
from tests.cluster.apiserver import KUBEFLOW_TRAINER, TRAINING_OPERATOR
from tests.cluster.cluster import Cluster, node
from tests.cluster.kfp_runner import KfpRun, ObjectStore
from tests.cluster.sandbox import SandboxUnavailable, built_images, check_available
from tests.integration.services import S3_ENV, start_mlflow, start_moto, stop

NAMESPACE = "kubeflow-user-example-com"  # a Kubeflow profile namespace
RUNNER = "default-editor"  # the service account KFP runs a profile's pipeline pods as
S3_SECRET = "alignflow-s3"
RELEASE = "af"  # not the name docs/install.md uses: nothing may depend on the release being called alignflow
CHART = Path(__file__).parents[2] / "helm" / "alignflow"
PIPELINE_BUCKET = "mlpipeline"  # a stock Kubeflow install's MinIO bucket
PIPELINE_ROOT = f"minio://{PIPELINE_BUCKET}/v2/artifacts"
DATA_BUCKET = "alignflow"  # the chart's s3.bucket: datasets, models
# The alignflow images run as their user `alignflow` (uid 1000, images/*/Dockerfile).
IMAGE_USERS = {"ghcr.io/alignflow/": (1000, 1000, "/home/alignflow")}
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


@dataclass(frozen=True)
class JobKind:
    """A cluster that runs one kind of training job, and how a test finds its jobs."""

    name: str
    """The launcher's name of the kind (`ALIGNFLOW_JOB_KIND`)."""
    resource: str
    """The API resource of its jobs."""
    serves: frozenset[str]
    """What the emulated API server serves: Kubeflow Trainer v2 only, or the Training Operator v1 only."""

    def jobs(self, cluster: Cluster) -> list[dict]:
        return cluster.jobs(resource=self.resource)

    def created(self, cluster: Cluster) -> list[dict]:
        """Every job of this kind created so far (also the deleted ones)."""
        return [e.object for e in cluster.store.history if e.resource == self.resource and e.type == "ADDED"]

    def pods(self, cluster: Cluster, job: str) -> list[dict]:
        label = "jobset.sigs.k8s.io/jobset-name" if self.resource == "trainjobs" else "training.kubeflow.org/job-name"
        return cluster.pods(NAMESPACE, f"{label}={job}")

    def running(self, cluster: Cluster, stage: str | None = None):
        """A predicate: a job (of `stage`) has a running pod."""
        return lambda: any(any(p["status"].get("phase") == "Running" for p in self.pods(cluster, j["metadata"]["name"]))
                           for j in self.jobs(cluster)
                           if stage is None or j["metadata"]["labels"].get("alignflow/stage") == stage)


# A cluster set up today (Kubeflow Trainer v2, no PyTorchJob CRD), and one with only the Training Operator v1.
KINDS = {"trainjob": JobKind("trainjob", "trainjobs", KUBEFLOW_TRAINER),
         "pytorchjob": JobKind("pytorchjob", "pytorchjobs", TRAINING_OPERATOR)}


def emulated_nodes() -> list[dict]:
    """One CPU node and one tainted GPU node (a GPU pool as `docs/install.md` describes it)."""
    return [node("cpu-0", cpu="8", memory="32Gi"),
            node("gpu-0", cpu="8", memory="64Gi", gpus=1, labels={"nvidia.com/gpu.present": "true"},
                 taints=[GPU_TAINT])]


@pytest.fixture(scope="session")
def sandbox() -> None:
    try:
        check_available()
    except SandboxUnavailable as err:
        pytest.skip(f"pods cannot be sandboxed here: {err}")


@pytest.fixture(scope="session")
def object_store(tmp_path_factory) -> str:
    """A moto S3 server standing in for MinIO; the pipeline root bucket exists, as after a Kubeflow install."""
    import boto3

    process, endpoint = start_moto(tmp_path_factory.mktemp("moto"))
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="test",
                 aws_secret_access_key="test").create_bucket(Bucket=PIPELINE_BUCKET)
    yield endpoint
    stop(process)


@pytest.fixture(scope="session")
def tracking_server(object_store, tmp_path_factory) -> str:
    """A real MLflow server (the platform's tracking service), its artifacts proxied to the S3 store."""
    import boto3

    boto3.client("s3", endpoint_url=object_store, region_name="us-east-1", aws_access_key_id="test",
                 aws_secret_access_key="test").create_bucket(Bucket="mlflow")
    env = {**S3_ENV, "MLFLOW_S3_ENDPOINT_URL": object_store, "AWS_ENDPOINT_URL": object_store}
    process, uri = start_mlflow(tmp_path_factory.mktemp("mlflow"), "s3://mlflow/artifacts", env)
    yield uri
    stop(process)


def render_chart(values: dict, api_versions: list[str] | tuple[str, ...] = ()) -> list[dict]:
    """The chart's manifests for `values` (release `af` in the profile namespace), by the Helm engine, on a cluster
    whose discovery lists `api_versions` (`Cluster.api_versions()`: the chart installs its TrainingRuntime only
    where Kubeflow Trainer is served)."""
    from tests.helm.chart import render

    return render(values, api_versions=tuple(api_versions), namespace=NAMESPACE)


def chart_values(endpoint: str, tracking_uri: str = "", kind: str = "trainjob") -> dict:
    """What a platform team writes for a MinIO-backed Kubeflow: the S3 endpoint and Secret, the pipeline root,
    their MLflow server, and how GPU nodes are selected and tolerated. The job kind is left `auto`; a cluster
    without Kubeflow Trainer cannot take the chart's TrainingRuntime (no such CRD), so it is not installed there."""
    return {"s3": {"endpoint": endpoint, "credentialsSecret": S3_SECRET, "bucket": DATA_BUCKET},
            "pipelineRoot": PIPELINE_ROOT, "mlflow": {"trackingUri": tracking_uri},
            "gpu": {"nodeSelector": {"nvidia.com/gpu.present": "true"},
                    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]},
            "training": {"runtime": {"create": kind == "trainjob"}},
            "scheduling": {"pollSeconds": 1}}  # the launcher looks every second: the emulated jobs are short


def install_platform(cluster: Cluster, endpoint: str, *, values: dict | None = None, secret: bool = True,
                     config_map: bool = True) -> list[dict]:
    """The platform team's steps: the chart (its ConfigMap, and its Role bound by the chart to KFP's runner), the S3
    Secret."""
    manifests = render_chart(values or chart_values(endpoint), cluster.api_versions())
    for manifest in sorted(manifests, key=lambda m: m["kind"] not in ("Role", "ClusterRole")):
        if manifest["kind"] == "ConfigMap" and not config_map:
            continue
        if manifest["kind"] in ("ConfigMap", "Role", "RoleBinding", "ServiceAccount", "TrainingRuntime"):
            cluster.apply(manifest, NAMESPACE)
    # KFP runs a profile's pipeline pods as default-editor: the chart's own RoleBinding (rbac.pipelineServiceAccounts)
    # must reach that account, with nothing bound by hand.
    binding = next(m for m in manifests if m["kind"] == "RoleBinding" and m["roleRef"]["kind"] == "Role")
    assert {"kind": "ServiceAccount", "name": RUNNER, "namespace": NAMESPACE} in binding["subjects"]
    if secret:
        cluster.create_namespace_objects(NAMESPACE, secrets_={S3_SECRET: dict(
            AWS_ACCESS_KEY_ID=S3_ENV["AWS_ACCESS_KEY_ID"], AWS_SECRET_ACCESS_KEY=S3_ENV["AWS_SECRET_ACCESS_KEY"])})
    return manifests


@dataclass
class Deployment:
    """The emulated cluster with the platform installed: what a pipeline run needs."""

    cluster: Cluster
    endpoint: str
    manifests: list[dict]
    packages: Path

    def package(self, pipeline: str) -> Path:
        """The pipeline compiled as the chart's upload Job compiles it (once per environment)."""
        environment = upload_job_environment(self.manifests)
        key = hashlib.sha256(json.dumps([pipeline, environment], sort_keys=True).encode()).hexdigest()[:12]
        folder = self.packages / key
        if not (folder / f"{pipeline}.yaml").is_file():
            folder.mkdir(parents=True, exist_ok=True)
            compile_as_upload_job(pipeline, self.manifests, folder)
        return folder / f"{pipeline}.yaml"

    def run(self, pipeline: str, arguments: dict, **options) -> KfpRun:
        """A KFP run in the profile namespace, its artifacts under the MinIO pipeline root."""
        return KfpRun(self.cluster, self.package(pipeline), namespace=NAMESPACE, service_account=RUNNER,
                      pipeline_root=PIPELINE_ROOT, object_store=ObjectStore(self.endpoint, S3_ENV),
                      arguments=arguments, **options)


@contextlib.contextmanager
def deployment(folder: Path, packages: Path, endpoint: str, *, tracking_uri: str = "", values: dict | None = None,
               secret: bool = True, config_map: bool = True, kind: str = "trainjob"):
    """A fresh emulated cluster serving one job kind (`KINDS`) with the platform installed (values: the
    chart's, default `chart_values`)."""
    with Cluster(folder, emulated_nodes(), image_users=IMAGE_USERS, image_roots=built_images(),
                 serves=KINDS[kind].serves) as cluster:
        values = values or chart_values(endpoint, tracking_uri, kind)
        manifests = install_platform(cluster, endpoint, values=values, secret=secret, config_map=config_map)
        yield Deployment(cluster, endpoint, manifests, packages)
        assert cluster.errors == [], f"the emulated control plane failed: {cluster.errors}"


@pytest.fixture(scope="session")
def packages(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("packages")


def upload_job_environment(manifests: list[dict]) -> dict[str, str]:
    """The environment of the chart's pipeline upload Job (its ConfigMap and Secret resolved), which is
    the environment the pipelines are compiled in on a cluster."""
    job = next(m for m in manifests if m["kind"] == "Job" and "upload" in m["metadata"]["name"])
    container = job["spec"]["template"]["spec"]["containers"][0]
    config_map = next(m for m in manifests if m["kind"] == "ConfigMap")
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        assert source["configMapRef"]["name"] == config_map["metadata"]["name"], source
        env.update(config_map["data"])
    secret = {"AWS_ACCESS_KEY_ID": S3_ENV["AWS_ACCESS_KEY_ID"], "AWS_SECRET_ACCESS_KEY": S3_ENV["AWS_SECRET_ACCESS_KEY"]}
    for item in container.get("env", []):
        env[item["name"]] = item.get("value") or secret[item["valueFrom"]["secretKeyRef"]["key"]]
    return env


def compile_as_upload_job(name: str, manifests: list[dict], folder: Path) -> Path:
    """`alignflow compile` in the upload Job's environment (images and platform names come from it)."""
    package = folder / f"{name}.yaml"
    env = {"PATH": os.environ["PATH"], "HOME": str(folder), **upload_job_environment(manifests)}
    done = subprocess.run([str(Path(sys.executable).parent / "alignflow"), "compile", name, "-o", str(package)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"alignflow compile {name} failed:\n{done.stdout}\n{done.stderr}"
    return package


@pytest.fixture(scope="session")
def tiny_inputs(object_store, tmp_path_factory) -> dict[str, str]:
    """The tiny model and task uploaded to the data bucket; the pipeline's input URI parameters for them."""
    from trainer.tiny.model import write_tiny_model
    from trainer.tiny.task import write_task

    folder = tmp_path_factory.mktemp("tiny-inputs")
    model = write_tiny_model(folder / "model")
    files = write_task(folder / "data")
    store = ObjectStore(object_store, S3_ENV)
    store.client.create_bucket(Bucket=DATA_BUCKET)
    store.upload(model, f"s3://{DATA_BUCKET}/models/tiny")
    for path in files.values():
        store.upload(path, f"s3://{DATA_BUCKET}/datasets/tiny/{path.name}")
    uris = {"base_model_uri": f"s3://{DATA_BUCKET}/models/tiny"}
    for parameter, name in (("sft_train_uri", "sft_train"), ("sft_eval_uri", "sft_eval"),
                            ("preference_train_uri", "pref_train"), ("preference_eval_uri", "pref_eval"),
                            ("prompts_uri", "prompts"), ("eval_prompts_uri", "eval_prompts")):
        uris[parameter] = f"s3://{DATA_BUCKET}/datasets/tiny/{files[name].name}"
    return uris






def tiny_arguments(package: Path, inputs: dict[str, str], **overrides) -> dict:
    """The tiny preset's parameters for a CPU-only emulated cluster (few steps), limited to what the pipeline
    accepts."""
    from pipelines.presets import TINY

    accepted = kfp_ir.load_package(package)[0]["root"]["inputDefinitions"]["parameters"]
    preset = TINY["rlhf-dpo"]
    arguments = {**inputs, **preset, "gpus_per_node": 0, "sft_epochs": 1, "dpo_epochs": 1,
                 "sft_settings": {**preset["sft_settings"], "train.max_steps": 8},
                 "dpo_settings": {**preset["dpo_settings"], "train.max_steps": 8}, **overrides}
    return {name: value for name, value in arguments.items() if name in accepted}
