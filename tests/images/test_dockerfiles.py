"""The Dockerfiles pass hadolint (no daemon can build them here; `make images` builds where one can)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

IMAGES = Path(__file__).parents[2] / "images"
HADOLINT = Path(sys.executable).parent / "hadolint"
# Every image folder with a Dockerfile, so a new image is checked without editing this list.
IMAGE_NAMES = sorted(path.parent.name for path in IMAGES.glob("*/Dockerfile"))


@pytest.mark.parametrize("image", IMAGE_NAMES)
def test_dockerfile_passes_hadolint(image):
    done = subprocess.run([str(HADOLINT), "--no-color", str(IMAGES / image / "Dockerfile")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("image", IMAGE_NAMES)
def test_image_runs_as_a_non_root_user_and_holds_no_secrets(image):
    text = (IMAGES / image / "Dockerfile").read_text()
    assert "\nUSER 1000\n" in text
    assert not any(word in text.upper() for word in ("AWS_SECRET", "PASSWORD", "TOKEN="))


def test_every_image_is_checked():
    assert {"trainer", "launcher", "mlflow"} <= set(IMAGE_NAMES)


def test_hadolint_catches_a_bad_dockerfile(tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN pip install torch\n")
    done = subprocess.run([str(HADOLINT), "--no-color", str(bad)], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "DL3007" in done.stdout  # the check really runs
