"""`make images` builds every image under images/ (read from what images/build.sh would run, DRY_RUN=1), with each
image's base and the proxy CA as the user sets them, tags the MLflow image as the chart expects, and stays out of
`make test`."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.images.lock import instructions

ROOT = Path(__file__).parents[2]
pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="no `make` on this machine")


def dry_run(**settings: str) -> str:
    env = {**os.environ, "DRY_RUN": "1", **settings}
    done = subprocess.run([str(ROOT / "images" / "build.sh")], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_make_images_runs_the_build_script():
    done = subprocess.run(["make", "-n", "images"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "images/build.sh" in done.stdout, done.stderr


def test_make_images_builds_every_dockerfile_under_images():
    built = re.findall(r"-f (images/[\w.-]+/Dockerfile) ", dry_run())
    dockerfiles = sorted(str(path.relative_to(ROOT)) for path in (ROOT / "images").glob("*/Dockerfile"))
    assert "images/mlflow/Dockerfile" in dockerfiles
    assert sorted(built) == dockerfiles


def test_the_mlflow_image_is_tagged_with_the_chart_mlflow_image_tag():
    values = yaml.safe_load((ROOT / "helm" / "alignflow" / "values.yaml").read_text())
    tag = re.search(r"-f images/mlflow/Dockerfile -t (\S+) \.", dry_run())
    assert tag and tag.group(1) == f"{values['mlflow']['image']['repository']}:{values['mlflow']['image']['tag']}"


def test_each_image_takes_its_own_base_and_the_registry_prefix():
    commands = dry_run(BASE_IMAGE="mirror.corp/python:3.11", TRAINER_BASE_IMAGE="mirror.corp/cuda-torch:2.13.0",
                       IMAGE_REGISTRY="registry.corp/ml", IMAGE_TAG="v1").splitlines()
    by_image = {re.search(r"-f images/(\w+)/", line).group(1): line for line in commands}
    assert "--build-arg BASE_IMAGE=mirror.corp/cuda-torch:2.13.0 " in by_image["trainer"]
    assert "--build-arg BASE_IMAGE=mirror.corp/python:3.11 " in by_image["launcher"]
    assert "--build-arg BASE_IMAGE=mirror.corp/python:3.11 " in by_image["mlflow"]
    assert by_image["trainer"].endswith("-t registry.corp/ml/trainer:v1 .")
    assert by_image["launcher"].endswith("-t registry.corp/ml/launcher:v1 .")


def test_a_proxy_ca_bundle_is_a_build_secret_not_a_build_argument(tmp_path):
    bundle = tmp_path / "corp-ca.pem"
    bundle.write_text("-----BEGIN CERTIFICATE-----\n")
    commands = dry_run(PIP_CA_BUNDLE=str(bundle)).splitlines()
    assert all(f"--secret id=pip_ca,src={bundle} " in line for line in commands)
    assert not any("--build-arg" in line and "pem" in line for line in commands)
    assert "export PIP_CERT=/run/secrets/pip_ca" in (ROOT / "images" / "pip_install.sh").read_text()
    for image in ("trainer", "launcher", "mlflow"):  # every install step mounts it for itself
        installs = [step for step in instructions((ROOT / "images" / image / "Dockerfile").read_text())
                    if step.startswith("RUN ") and "pip_install.sh" in step]
        assert installs and all(step.startswith("RUN --mount=type=secret,id=pip_ca ") for step in installs)


def test_a_missing_ca_bundle_and_an_unknown_builder_are_one_line_errors(tmp_path):
    for settings, expected in (({"PIP_CA_BUNDLE": str(tmp_path / "none.pem")}, "is not a file"),
                               ({"BUILDER": "kaniko"}, "expected docker, buildah or podman")):
        done = subprocess.run([str(ROOT / "images" / "build.sh")], env={**os.environ, "DRY_RUN": "1", **settings},
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and expected in done.stderr and len(done.stderr.splitlines()) == 1


def test_make_test_does_not_build_images():
    rule = re.search(r"^test:(.*)$", (ROOT / "Makefile").read_text(), re.MULTILINE)
    assert rule and not {"images", "test-images", "local-bases"} & set(rule.group(1).split())
    done = subprocess.run(["make", "-n", "test"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert "build.sh" not in done.stdout and "Dockerfile" not in done.stdout
