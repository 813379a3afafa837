"""What `make test-images` runs on the built images, inside a network namespace of its own (only loopback).

Standalone checks of each image as the cluster runs it (`CHECKS`), then the pytest scenarios that take the built
images when `ALIGNFLOW_TEST_IMAGES` lists them (`SCENARIOS`): the chart's MLflow server on the MLflow image, and
the emulated cluster's pods on the launcher and trainer images. Writes one JSON row per check to `--results`.

    python -m tests.images.real.checks --images LISTING.json --results RESULTS.json --workdir DIR
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import yaml

from tests.cluster.sandbox import BUILT_IMAGES_VARIABLE, ImageRoot, built_images
from tests.images.real import built, containers
from tests.integration.services import S3_ENV, start_moto, stop, wait_until_up

TRAINER, LAUNCHER = "ghcr.io/alignflow/trainer:latest", "ghcr.io/alignflow/launcher:latest"
ROOT = Path(__file__).parents[3]
# pytest scenarios that run on the built images: (image it proves, what runs, pytest arguments)
SCENARIOS = [
    ("mlflow", "the chart's MLflow server (rendered args and env) on PostgreSQL 15 and S3: runs, params, artifacts",
     ["tests/helm/test_mlflow_server.py"]),
    ("launcher+trainer", "emulated clusters: rlhf-dpo (sft -> dpo) through KFP's executor_main on the launcher image,"
                         " TrainJob pods (Kubeflow SDK) and PyTorchJob pods on the trainer image, S3 between pods, MLflow",
     ["tests/cluster/test_pipeline_run.py"]),
    ("trainer", "emulated clusters: a 2-node TrainJob and a 2-node elastic PyTorchJob survive a killed node (the"
                " TrainJob a preemption too) and resume", ["tests/cluster/test_multi_node.py"]),
    ("trainer", "the code sandbox's escape tests, the trainer stand-in in a pod of the image as its user (the image's"
                " Python and trainer, a service-account token mounted): each escape contained",
     ["tests/trainer/sandbox/test_local.py"]),
]


class Context:
    def __init__(self, images: dict[str, ImageRoot], workdir: Path, endpoint: str) -> None:
        self.images, self.workdir, self.endpoint = images, workdir, endpoint

    def image(self, prefix: str) -> tuple[str, ImageRoot]:
        [(name, root)] = [(name, root) for name, root in self.images.items() if name.startswith(prefix)]
        return name, root

    def folder(self, name: str) -> Path:
        path = self.workdir / name
        path.mkdir(parents=True)
        return path


def trainer_default_command(ctx: Context) -> str:
    """The image's CMD where the hostname does not resolve (buildah's default): help at once, no rendezvous."""
    _, root = ctx.image("ghcr.io/alignflow/trainer")
    command = built.image_config(TRAINER)["Cmd"]
    started = time.monotonic()
    done = containers.run(root, ctx.folder("trainer-cmd"), command, timeout=120)
    assert done.returncode == 0 and "sft" in done.stdout, done.stdout[-2000:] + done.stderr[-2000:]
    return f"`{' '.join(command)}` printed the stages in {time.monotonic() - started:.0f} s"


def trainer_stage(ctx: Context) -> str:
    """A tiny SFT stage with the PyTorchJob's exact command and env, as uid 1000, reading its config, model and data
    from S3 and writing to a relative output_dir (the image's WORKDIR must be the user's), with no tracking URI."""
    import boto3

    from components.launcher.kinds.pytorchjob.manifest import build_pytorchjob
    from components.launcher.pod.spec import JobSpec
    from trainer.tiny.model import write_tiny_model
    from trainer.tiny.task import write_task

    store = boto3.client("s3", endpoint_url=ctx.endpoint, region_name=S3_ENV["AWS_DEFAULT_REGION"],
                         aws_access_key_id=S3_ENV["AWS_ACCESS_KEY_ID"],
                         aws_secret_access_key=S3_ENV["AWS_SECRET_ACCESS_KEY"])
    store.create_bucket(Bucket="alignflow")
    model, files = write_tiny_model(ctx.folder("tiny") / "model"), write_task(ctx.workdir / "tiny" / "data")
    for path in model.iterdir():
        store.upload_file(str(path), "alignflow", f"models/tiny/{path.name}")
    store.upload_file(str(files["sft_train"]), "alignflow", "datasets/sft_train.jsonl")
    config = {"output_dir": "runs/sft", "model": {"path": "s3://alignflow/models/tiny"},
              "data": {"train_path": "s3://alignflow/datasets/sft_train.jsonl", "max_length": 32},
              "train": {"max_epochs": 1, "max_steps": 4, "micro_batch_size": 8}}
    store.put_object(Bucket="alignflow", Key="runs/sft.yaml", Body=yaml.safe_dump(config).encode())

    name = "image-check-sft"
    job = build_pytorchjob(JobSpec(name=name, stage="sft", config_uri="s3://alignflow/runs/sft.yaml", image=TRAINER,
                                   env={"AWS_ENDPOINT_URL": ctx.endpoint, "AWS_DEFAULT_REGION": "us-east-1"}))
    container = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    pod = f"{name}-master-0"
    env = {item["name"]: item["value"] for item in container["env"] if "value" in item}
    env.update(S3_ENV)  # the Secret's keys, as the kubelet resolves them
    # What the Training Operator injects into a single-Master job (tests/cluster/training_operator.py).
    env.update(MASTER_ADDR=pod, PET_MASTER_ADDR=pod, MASTER_PORT="23456", PET_MASTER_PORT="23456", WORLD_SIZE="1",
               RANK="0", PET_NNODES="1", PET_NODE_RANK="0", PET_NPROC_PER_NODE=str(job["spec"].get("nprocPerNode")))
    folder = ctx.folder("trainer-sft")
    _, root = ctx.image("ghcr.io/alignflow/trainer")
    done = containers.run(root, folder, container["command"], env, hostname=pod, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    # No MLFLOW_TRACKING_URI, and the image has MLflow's client only: one warning, then training as usual.
    assert "MLflow's client only" in done.stdout + done.stderr, done.stderr[-3000:]
    written = containers.upper_layer(folder) / root.workdir.lstrip("/") / "runs" / "sft"
    weights = written / "model" / "model.safetensors"
    assert weights.is_file(), sorted(str(p) for p in written.rglob("*"))[:20]
    assert weights.stat().st_uid == root.user[0] and weights.stat().st_mode & 0o777 == 0o644, oct(weights.stat().st_mode)
    return (f"`{' '.join(container['command'][:6])} ...` as uid {root.user[0]}: 4 steps from S3, model in "
            f"{root.workdir}/runs/sft/model (0644); no tracking URI: one warning")


def mlflow_alone(ctx: Context) -> str:
    """The image's own CMD, outside the chart: a tracking API call by a cluster DNS name is answered."""
    _, root = ctx.image("ghcr.io/alignflow/mlflow")
    log = ctx.workdir / "mlflow-alone.log"
    server = containers.start(root, ctx.folder("mlflow-alone"), ["mlflow", "server", "--host=0.0.0.0", "--port=5000",
                                                                  "--workers=1"], log=log)
    try:
        wait_until_up("http://127.0.0.1:5000/health", server, 120, log)
        request = urllib.request.Request("http://127.0.0.1:5000/api/2.0/mlflow/experiments/search?max_results=1",
                                         headers={"Host": "mlflow.ml-platform.svc.cluster.local:5000"})
        with urllib.request.urlopen(request, timeout=30) as response:
            assert response.status == 200 and "experiments" in json.loads(response.read())
    finally:
        stop(server)
    return "`mlflow server` (the image's CMD): experiments/search by Host mlflow.ml-platform.svc.cluster.local -> 200"


def launcher_commands(ctx: Context) -> str:
    """The image's CMD, and `alignflow compile` as the chart's upload Job runs it."""
    _, root = ctx.image("ghcr.io/alignflow/launcher")
    done = containers.run(root, ctx.folder("launcher-help"), ["alignflow", "--help"], timeout=120)
    assert done.returncode == 0 and "compile" in done.stdout, done.stdout + done.stderr
    folder = ctx.folder("launcher-compile")
    done = containers.run(root, folder, ["alignflow", "compile", "rlhf-dpo", "-o", "/tmp/rlhf-dpo.yaml"], timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    package = next(yaml.safe_load_all((folder / "fs" / "tmp" / "rlhf-dpo.yaml").read_text()))
    assert package["pipelineInfo"]["name"] == "rlhf-dpo"
    return "`alignflow --help`; `alignflow compile rlhf-dpo` wrote the pipeline"


def no_proxy_ca_in_images(ctx: Context) -> str:
    """The proxy CA reached pip as a build secret: no layer of any image holds it."""
    bodies = [line for path in Path("/usr/local/share/ca-certificates").glob("*.crt")
              for line in path.read_text().splitlines()[3:4]]  # one line of each certificate's base64 body
    if not bodies:
        return "no extra CA on this machine to look for"
    for name, root in ctx.images.items():
        for body in bodies:
            found = subprocess.run(["grep", "-rlF", "--", body, str(root.path)], capture_output=True, text=True)
            assert found.stdout == "", f"{name} holds the build's CA: {found.stdout.splitlines()[:3]}"
    return f"{len(bodies)} proxy CA certificate(s) in no file of the {len(ctx.images)} images"


CHECKS: list[tuple[str, Callable[[Context], str]]] = [
    ("trainer", trainer_default_command), ("trainer", trainer_stage), ("mlflow", mlflow_alone),
    ("launcher", launcher_commands), ("all", no_proxy_ca_in_images)]


def run_scenario(arguments: list[str], log: Path) -> tuple[bool, str]:
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *arguments], cwd=ROOT,
                          stdout=log.open("w"), stderr=subprocess.STDOUT, timeout=1800)
    summary = [line for line in log.read_text().splitlines() if " passed" in line or " failed" in line or
               " error" in line or "skipped" in line]
    return done.returncode == 0 and not any("skipped" in s for s in summary), (summary or ["no summary"])[-1].strip("= ")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=Path, required=True)
    parser.add_argument("--results", type=Path, required=True)
    parser.add_argument("--workdir", type=Path, required=True)
    options = parser.parse_args()
    import os

    os.environ[BUILT_IMAGES_VARIABLE] = str(options.images)
    images = built_images()
    rows = []
    process, endpoint = start_moto(options.workdir)
    try:
        ctx = Context(images, options.workdir, endpoint)
        for image, check in CHECKS:
            started = time.monotonic()
            try:
                rows.append({"image": image, "ran": check(ctx), "ok": True})
            except Exception as err:  # every check reports, whatever fails
                rows.append({"image": image, "ran": check.__doc__.split(".")[0], "ok": False,
                             "error": f"{type(err).__name__}: {str(err)[-1500:]}"})
            rows[-1]["seconds"] = round(time.monotonic() - started)
    finally:
        stop(process)
    for image, what, arguments in SCENARIOS:
        started = time.monotonic()
        ok, summary = run_scenario(arguments, options.workdir / f"pytest-{len(rows)}.log")
        rows.append({"image": image, "ran": what, "ok": ok, "error": "" if ok else summary, "summary": summary,
                     "seconds": round(time.monotonic() - started), "log": str(options.workdir / f"pytest-{len(rows)}.log")})
    options.results.write_text(json.dumps(rows, indent=1))
    return 0 if all(row["ok"] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
