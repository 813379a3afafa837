"""What the images install, read from their Dockerfiles, and an offline check that the lock resolves it.

`image_requirements` reads the arguments of each Dockerfile's installs through the lock (`images/pip_install.sh`):
package names, or the project with extras (`.[lora,s3]`). `check_resolves` walks those requirements and everything they require, as the
metadata of the installed distributions says (the test environment is installed from the same lock, so that
metadata is the locked versions'), and collects every requirement the locked version does not satisfy, every
package missing from the lock, and every package the lock has that this environment lacks (its requirements would
go unchecked). Markers are evaluated for the images' platform: CPython 3.11 on Linux x86-64.
"""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).parents[2]
LOCK = ROOT / "constraints.txt"
IMAGE_PLATFORM = {**default_environment(), "python_version": "3.11", "python_full_version": "3.11.2",
                  "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64",
                  "os_name": "posix", "implementation_name": "cpython", "platform_python_implementation": "CPython"}


def read_lock(text: str) -> dict[str, Version]:
    """{canonical name: version} of a constraints file's `name==version` lines."""
    pins = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            pins[canonicalize_name(name)] = Version(version)
    return pins


def instructions(dockerfile: str) -> list[str]:
    """The Dockerfile's instructions, continuation lines joined and comment lines dropped."""
    lines = [line for line in dockerfile.splitlines() if not line.lstrip().startswith("#")]
    return [part.strip() for part in re.split(r"(?<!\\)\n", "\n".join(lines)) if part.strip()]


def locked_installs(dockerfile: str) -> list[list[str]]:
    """The arguments of every install through the lock (`images/pip_install.sh`, unless ALIGNFLOW_NO_LOCK is set),
    one list per command; `--no-deps` installs of the project's own code are left out."""
    installs = []
    for instruction in (i for i in instructions(dockerfile) if i.startswith("RUN ")):
        for command in re.split(r"&&|;|\bthen\b|\belse\b", instruction.replace("\\\n", " ")):
            words = command.split()
            at = next((i for i, word in enumerate(words) if word.endswith("pip_install.sh")), None)
            # --no-deps installs the project's own code alone (its requirements are already there, or not wanted)
            if at is not None and "--no-deps" not in words and not any(
                    word.startswith("ALIGNFLOW_NO_LOCK=") for word in words[:at]):
                installs.append([word.strip("\"'") for word in words[at + 1:] if not word.startswith("-")])
    return installs


def project_requirements(extras: list[str]) -> list[Requirement]:
    """The project's own requirements with `extras`, from its installed metadata (pyproject.toml's)."""
    found = []
    for text in metadata.requires("alignflow") or []:
        requirement = Requirement(text)
        marker = requirement.marker
        if marker is None or any(marker.evaluate({**IMAGE_PLATFORM, "extra": extra}) for extra in extras):
            requirement.marker = None
            found.append(requirement)
    return found


def image_requirements(dockerfile: str) -> list[Requirement]:
    """Every requirement an image's locked pip installs name (the project's own, for `.[extras]`)."""
    requirements = []
    for arguments in locked_installs(dockerfile):
        for argument in arguments:
            if argument.startswith(".["):
                requirements += project_requirements(argument[2:-1].split(","))
            elif argument == ".":
                requirements += project_requirements([])
            else:
                requirements.append(Requirement(argument))
    return requirements


def installed_requirements(name: str, extras: set[str]) -> list[Requirement]:
    found = []
    for text in metadata.requires(name) or []:
        requirement = Requirement(text)
        marker = requirement.marker
        if marker is None or any(marker.evaluate({**IMAGE_PLATFORM, "extra": extra}) for extra in extras | {""}):
            found.append(requirement)
    return found


def check_resolves(roots: list[Requirement], lock: dict[str, Version]) -> list[str]:
    """Every way the locked versions fail `roots` and what they require (an empty list: they resolve)."""
    problems, seen = [], set()
    pending = [(requirement, "the image") for requirement in roots]
    while pending:
        requirement, wanted_by = pending.pop()
        name = canonicalize_name(requirement.name)
        if name not in lock:
            problems.append(f"{requirement} (wanted by {wanted_by}) is not in the lock")
            continue
        if not requirement.specifier.contains(lock[name], prereleases=True):
            problems.append(f"{wanted_by} requires {requirement}, but the lock pins {name}=={lock[name]}")
        key = (name, frozenset(requirement.extras))
        if key in seen:
            continue
        seen.add(key)
        try:
            installed = Version(metadata.version(name))
        except metadata.PackageNotFoundError:
            problems.append(f"{name} is locked but not installed here, so what it requires cannot be checked")
            continue
        if Version(installed.public) != lock[name]:
            problems.append(f"{name} is {installed} here but {lock[name]} in the lock: run `make venv`")
            continue
        pending += [(child, f"{name}=={lock[name]}") for child in installed_requirements(name, set(requirement.extras))]
    return problems


def closure(roots: list[Requirement], lock: dict[str, Version]) -> set[str]:
    """The canonical names of `roots` and everything they require, for the images' platform."""
    found, pending = set(), list(roots)
    while pending:
        requirement = pending.pop()
        name = canonicalize_name(requirement.name)
        if name in found or name not in lock:
            continue
        found.add(name)
        pending += installed_requirements(name, set(requirement.extras))
    return found
