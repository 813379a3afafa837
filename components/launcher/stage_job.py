"""What every stage component does: write the stage config, launch its PyTorchJob, read its results.

A component passes its KFP inputs as URIs. The job's checkpoints and logs live under `job_root`
(keyed by pipeline run and task, so a retried task resumes from its checkpoint), and its final
HF model is written straight to the component's output Model URI (`export_dir`).
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field

import yaml

from components.launcher.manifest import JobSpec, SecretEnv, build_pytorchjob, derive_job_name
from trainer.storage import get_storage, join_uri

logger = logging.getLogger(__name__)


SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


def current_namespace() -> str:
    """The namespace this pod runs in (where KFP runs the component), else `default`."""
    try:
        with open(SERVICE_ACCOUNT_NAMESPACE) as handle:
            return handle.read().strip() or "default"
    except OSError:
        return "default"


def run_label(run_id: str) -> str:
    """The `alignflow/run` label value of a run's jobs (a valid label value, at most 63 characters)."""
    return re.sub(r"[^A-Za-z0-9_.-]", "-", run_id)[:63].strip("-_.") or "run"


@dataclass(slots=True)
class ClusterOptions:
    """Where and how the job runs. `mode` is `local` (processes on this machine) or `kubernetes`."""

    mode: str = "local"
    image: str = "alignflow-trainer:latest"
    namespace: str = field(default_factory=current_namespace)
    num_nodes: int = 1
    nproc_per_node: int = 1
    gpus_per_node: int = 0
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: list[dict] = field(default_factory=list)
    s3_secret: str = ""
    env: dict[str, str] = field(default_factory=dict)
    timeout_seconds: float = 86400.0
    # Pod restarts inside the job; KFP's own task retries (pipelines/options.py) come on top.
    backoff_limit: int = 1


def stage_manifest(stage: str, config_uri: str, run_id: str, task: str, cluster: ClusterOptions) -> dict:
    """The PyTorchJob a stage component creates."""
    secrets = [SecretEnv("AWS_ACCESS_KEY_ID", cluster.s3_secret, "AWS_ACCESS_KEY_ID"),
               SecretEnv("AWS_SECRET_ACCESS_KEY", cluster.s3_secret, "AWS_SECRET_ACCESS_KEY")] if cluster.s3_secret else []
    spec = JobSpec(name=derive_job_name(run_id, task), stage=stage, config_uri=config_uri, image=cluster.image,
                   namespace=cluster.namespace, num_nodes=cluster.num_nodes, nproc_per_node=cluster.nproc_per_node,
                   gpus_per_node=cluster.gpus_per_node, node_selector=cluster.node_selector,
                   tolerations=cluster.tolerations, secret_env=secrets, backoff_limit=cluster.backoff_limit,
                   env={"ALIGNFLOW_PIPELINE_RUN_ID": run_id, **cluster.env},
                   labels={"alignflow/run": run_label(run_id)})
    return build_pytorchjob(spec)


def run_stage_job(stage: str, config: dict, *, model_uri: str, job_root: str, run_id: str, task: str,
                  cluster: ClusterOptions) -> dict[str, float]:
    """Launch `python -m trainer <stage>` as a PyTorchJob and return its final metrics."""
    job_root = job_root.rstrip("/")
    config = {**config, "output_dir": job_root, "export_dir": model_uri}
    config_uri = join_uri(job_root, f"{stage}.yaml")
    storage = get_storage(job_root)
    storage.write_bytes(config_uri, yaml.safe_dump(config, sort_keys=False).encode())
    manifest = stage_manifest(stage, config_uri, run_id, task, cluster)
    if cluster.mode == "local":
        from components.launcher.local import run_local

        run_local(manifest, timeout=cluster.timeout_seconds, log=print)
    else:
        from components.launcher.kubernetes import KubernetesLauncher

        KubernetesLauncher().run(manifest, timeout=cluster.timeout_seconds)
    return json.loads(storage.read_bytes(join_uri(job_root, "final_metrics.json")))


def sparkline(values: list[float]) -> str:
    """A one-line plot of a curve, for Markdown reports."""
    if not values:
        return ""
    bars = "▁▂▃▄▅▆▇█"
    low, high = min(values), max(values)
    span = (high - low) or 1.0
    step = max(1, len(values) // 60)
    return "".join(bars[int((v - low) / span * (len(bars) - 1))] for v in values[::step])


def stage_report(stage: str, config: dict, metrics: dict[str, float], job_root: str) -> str:
    """Markdown for the KFP UI: final metrics, curves of the logged metrics, the resolved config."""
    storage = get_storage(job_root)
    history_uri = join_uri(job_root, "metrics.jsonl")
    history = [json.loads(line) for line in storage.read_bytes(history_uri).decode().splitlines()] \
        if storage.exists(history_uri) else []
    lines = [f"# {stage}", "", "| metric | value |", "|---|---|"]
    lines += [f"| {key} | {value:.4g} |" for key, value in sorted(metrics.items()) if isinstance(value, (int, float))]
    curves = ["loss", "episode/reward_mean", "episode/kl_to_ref", "eval/loss", "eval/accuracy"]
    lines += ["", "## Curves", ""]
    for key in curves:
        values = [row[key] for row in history if key in row]
        if len(values) > 1:
            lines.append(f"- `{key}` {values[0]:.3g} `{sparkline(values)}` {values[-1]:.3g}")
    samples_uri = join_uri(job_root, "samples.jsonl")
    if storage.exists(samples_uri):
        samples = [json.loads(line) for line in storage.read_bytes(samples_uri).decode().splitlines() if line]
        lines += ["", "## Sample generations (last episode)", "", "| prompt | response | score |", "|---|---|---|"]
        lines += [f"| {_cell(s['prompt'])} | {_cell(s['response'])} | {s['score']:.3g} |" for s in samples]
    run_uri = join_uri(job_root, "mlflow_run.json")
    if storage.exists(run_uri):
        run = json.loads(storage.read_bytes(run_uri))
        where = f"[{run['run_id']}]({run['link']})" if run.get("link") else f"`{run['run_id']}` in `{run['tracking_uri']}`"
        lines += ["", f"MLflow run: {where}"]
    lines += ["", "## Config", "", "```yaml", yaml.safe_dump(config, sort_keys=False).strip(), "```"]
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    """Text safe inside a Markdown table cell."""
    return str(text).replace("|", "\\|").replace("\n", " ")[:200]
