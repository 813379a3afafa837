"""One lock pins every image's packages, resolves them together, and is what the tests run against.

The lock (constraints.txt) is a `pip freeze` of a resolved environment (`make lock`); every Dockerfile installs
through it (images/pip_install.sh) and names no version of its own, so an image cannot pin a set that does not resolve (kfp 2.17 requires
kubernetes<31: a launcher image pinned to kubernetes 37 failed to build). The resolver check reads the metadata of
the installed distributions, offline.
"""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests.images.lock import LOCK, check_resolves, image_requirements, locked_installs, read_lock

IMAGES = Path(__file__).parents[2] / "images"
IMAGE_NAMES = ("trainer", "launcher", "mlflow")


def dockerfile(image: str) -> str:
    return (IMAGES / image / "Dockerfile").read_text()


@pytest.mark.parametrize("image", IMAGE_NAMES)
def test_every_image_installs_through_the_lock_and_names_no_version(image):
    text = dockerfile(image)
    installs = locked_installs(text)
    assert installs, f"{image}: no install through images/pip_install.sh"
    assert "pip install" not in "\n".join(line for line in text.splitlines() if not line.startswith("#"))
    for arguments in installs:
        assert not [argument for argument in arguments if re.search(r"[=<>~!]=|[<>]", argument)], arguments


def test_the_install_script_pins_through_the_lock_beside_it():
    script = (IMAGES / "pip_install.sh").read_text()
    assert 'PIP_CONSTRAINT="$(dirname "$0")/constraints.txt"' in script  # also pins isolated build environments
    for image in IMAGE_NAMES:  # the lock is copied beside the script
        assert re.search(r"^COPY constraints\.txt images/pip_install\.sh ", dockerfile(image), re.MULTILINE)


@pytest.mark.parametrize("image", IMAGE_NAMES)
def test_the_lock_resolves_every_image(image):
    problems = check_resolves(image_requirements(dockerfile(image)), read_lock(LOCK.read_text()))
    assert problems == []


def test_a_lock_that_cannot_resolve_is_caught():
    """The launcher as it once was: kubernetes 37 beside kfp 2.17, which requires kubernetes<31."""
    lock = read_lock(LOCK.read_text())
    lock[canonicalize_name("kubernetes")] = Version("37.0.2")
    problems = check_resolves(image_requirements(dockerfile("launcher")), lock)
    assert any("kfp" in problem and "kubernetes" in problem and "37.0.2" in problem for problem in problems), problems
    del lock["boto3"]
    assert any(problem.startswith("boto3 ") and "not in the lock" in problem
               for problem in check_resolves([Requirement("boto3")], lock))


def test_the_tests_run_against_the_locked_versions():
    lock = read_lock(LOCK.read_text())
    installed = {canonicalize_name(d.metadata["Name"]): Version(Version(d.version).public)
                 for d in metadata.distributions()}
    differs = {name: (str(installed[name]), str(version)) for name, version in lock.items()
               if name in installed and installed[name] != version}
    assert differs == {}, "installed != locked (run `make venv`)"
    assert {"torch", "transformers", "kfp", "kubernetes", "boto3", "mlflow-skinny"} <= set(installed) & set(lock)
