"""`make images` builds every image under images/ (read from what make would run, `make -n`), tags the MLflow
image as the chart expects, and stays out of `make test`."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).parents[2]
pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="no `make` on this machine")


def dry_run(target: str) -> str:
    done = subprocess.run(["make", "-n", target], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_make_images_builds_every_dockerfile_under_images():
    built = re.findall(r"-f (images/[\w.-]+/Dockerfile) ", dry_run("images"))
    dockerfiles = sorted(str(path.relative_to(ROOT)) for path in (ROOT / "images").glob("*/Dockerfile"))
    assert "images/mlflow/Dockerfile" in dockerfiles
    assert sorted(built) == dockerfiles


def test_the_mlflow_image_is_tagged_with_the_chart_mlflow_image_tag():
    values = yaml.safe_load((ROOT / "helm" / "alignflow" / "values.yaml").read_text())
    tag = re.search(r"-f images/mlflow/Dockerfile -t alignflow-mlflow:(\S+) images/mlflow", dry_run("images"))
    assert tag and tag.group(1) == values["mlflow"]["image"]["tag"]


def test_make_test_does_not_build_images():
    rule = re.search(r"^test:(.*)$", (ROOT / "Makefile").read_text(), re.MULTILINE)
    assert rule and "images" not in rule.group(1).split()
    assert "Dockerfile" not in dry_run("test")
