"""Running a built image's command as a container would, on this machine: `tests/cluster/sandbox.py`'s pod
filesystem over the image (its writable layer the pod's own), as the image's user, with the image's ENV under the
container's, from its WORKDIR."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.cluster.sandbox import ImageRoot, PodFilesystem


def prepare(root: ImageRoot, folder: Path, env: dict[str, str], *, hosts: dict[str, str] | None = None,
            hostname: str = "", volumes: dict[str, Path] | None = None) -> tuple[PodFilesystem, dict[str, str]]:
    """The container's filesystem (under `folder`) and its whole environment."""
    fs = PodFilesystem(folder, hosts, hostname=hostname, image=root, volumes=volumes)
    uid, gid, home = root.user
    fs.run_as(uid, gid, home)
    return fs, {**root.env, "HOME": home, **({"HOSTNAME": hostname} if hostname else {}), **env}


def run(root: ImageRoot, folder: Path, argv: list[str], env: dict[str, str] | None = None, *, timeout: float,
        **options) -> subprocess.CompletedProcess:
    """Run `argv` in a container of the image to its end (output captured)."""
    fs, environment = prepare(root, folder, env or {}, **options)
    command, outer_env = fs.command(argv, environment)
    return subprocess.run(command, env=outer_env, capture_output=True, text=True, timeout=timeout)


def start(root: ImageRoot, folder: Path, argv: list[str], env: dict[str, str] | None = None, *, log: Path,
          **options) -> subprocess.Popen:
    """Start `argv` in a container of the image (a server); its output goes to `log`."""
    fs, environment = prepare(root, folder, env or {}, **options)
    command, outer_env = fs.command(argv, environment)
    return subprocess.Popen(command, env=outer_env, stdout=log.open("w"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def upper_layer(folder: Path) -> Path:
    """Where what the container wrote over the image lies (the overlay's upper directory)."""
    return folder / "upper"
