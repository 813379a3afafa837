"""The Dockerfiles pass hadolint, run as a non-root user, and their defaults work (`make test-images` builds and
runs the images themselves)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

IMAGES = Path(__file__).parents[2] / "images"
HADOLINT = Path(sys.executable).parent / "hadolint"
# Every image folder with a Dockerfile, so a new image is checked without editing this list.
IMAGE_NAMES = sorted(path.parent.name for path in IMAGES.glob("*/Dockerfile"))
# The registry-free bases `make test-images` builds (images/bases/) are linted too.
ALL_DOCKERFILES = sorted([*IMAGES.glob("*/Dockerfile"), *IMAGES.glob("bases/*.Dockerfile")])


def default_command(image: str) -> list[str]:
    [command] = re.findall(r"^CMD (\[.*\])$", (IMAGES / image / "Dockerfile").read_text(), re.MULTILINE)
    return json.loads(command)


@pytest.mark.parametrize("dockerfile", ALL_DOCKERFILES, ids=lambda path: str(path.relative_to(IMAGES)))
def test_dockerfile_passes_hadolint(dockerfile):
    done = subprocess.run([str(HADOLINT), "--no-color", str(dockerfile)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_trainer_images_default_command_answers_at_once():
    """`torchrun -m trainer --help` started a rendezvous store first, which waited some 10 minutes for a hostname
    that does not resolve in a bare container; the default command must print help without any network."""
    command = default_command("trainer")
    assert "torchrun" not in command
    assert command[:3] == ["python", "-m", "trainer"]
    done = subprocess.run([sys.executable, *command[1:]], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "sft" in done.stdout


def test_the_mlflow_image_alone_answers_any_host_and_runs_no_job_runner():
    """Outside the chart (which narrows it with --allowed-hosts) MLflow's default admits only localhost and
    private IPs: a Service name got 403. The image sets the variables the installed `mlflow server` reads."""
    from mlflow.cli import server

    envvars = {parameter.name: parameter.envvar for parameter in server.params}
    text = (IMAGES / "mlflow" / "Dockerfile").read_text()
    assert f'{envvars["allowed_hosts"]}="*"' in text
    assert "MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false" in text


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
