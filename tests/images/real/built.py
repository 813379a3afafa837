"""The images `make test-images` built, as buildah holds them: mounted filesystems, configs, sizes.

A container of each image is created (`buildah from`) and its filesystem mounted (`buildah mount`), which is the
lower layer every pod of that image gets (`tests/cluster/sandbox.py`). Its user, HOME, WORKDIR and ENV are read
from the image's config and its /etc/passwd, as a container runtime reads them.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import asdict
from pathlib import Path

from tests.cluster.sandbox import ImageRoot


def buildah(*args: str) -> str:
    done = subprocess.run(["buildah", *args], capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"buildah {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout.strip()


def image_sizes() -> dict[str, str]:
    """Each local image's size as buildah shows it (uncompressed layers: `1.27 GB`), by name."""
    return {name: image["size"] for image in json.loads(buildah("images", "--json")) for name in image.get("names") or []}


def user_of(root: Path, user: str) -> tuple[int, int, str]:
    """(uid, gid, HOME) of the image's USER (a name or uid[:gid]) from its /etc/passwd; root when none is set."""
    name, _, group = (user or "0").partition(":")
    for line in (root / "etc" / "passwd").read_text().splitlines():
        fields = line.split(":")
        if name in (fields[0], fields[2]):
            return int(fields[2]), int(group or fields[3]), fields[5]
    return int(name), int(group or name), "/"


def image_config(image: str) -> dict:
    """The image's OCI config: User, Env, WorkingDir, Cmd, ..."""
    return json.loads(buildah("inspect", "--type", "image", image))["OCIv1"]["config"]


def mount(image: str) -> tuple[str, ImageRoot]:
    """(buildah container, ImageRoot) of `image`; `unmount(container)` releases it."""
    config = image_config(image)
    container = buildah("from", "--pull-never", image)
    root = Path(buildah("mount", container))
    env = dict(item.split("=", 1) for item in config.get("Env") or [])
    return container, ImageRoot(root, env, config.get("WorkingDir") or "/", user_of(root, config.get("User", "")))


def unmount(container: str) -> None:
    buildah("umount", container)
    buildah("rm", container)


def write_listing(roots: dict[str, ImageRoot], path: Path) -> Path:
    """The file `tests.cluster.sandbox.built_images` reads (BUILT_IMAGES_VARIABLE names it)."""
    path.write_text(json.dumps({name: {**asdict(root), "path": str(root.path)} for name, root in roots.items()}))
    return path
