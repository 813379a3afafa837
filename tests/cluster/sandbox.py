"""A pod's filesystem on this machine: a private mount namespace with the paths a container would see.

Each emulated pod (a KFP component pod or a PyTorchJob replica) runs in a new mount namespace whose
root is a tmpfs holding bind mounts of this machine's top-level folders (so the same Python, venv
and project are there, as in an image), except for the folders a pod owns: `/tmp` (mode 1777),
`/home` (the image user's HOME), `/run` (where `/var/run/secrets/kubernetes.io/serviceaccount`
lives), `/workspace` (its empty working directory, root-owned like an image's WORKDIR) and KFP's
artifact mounts `/minio`, `/s3` and `/gcs` (world-writable, as KFP's emptyDir volumes); `/root`
is the pod's too. Those are the pod's own folders on the host, so the emulator can play the KFP launcher: download input
artifacts into them before the container starts and upload outputs from them afterwards.
What the image would hold is bound in wherever it lies on this machine (`HOST_BINDS`): the
checkout (the project the image installs), the virtualenv and the Python it was made from, each at
its own path, also when that path is under one of the pod's own folders (a clone in `$HOME` or
`/tmp`, pyenv in `/root`). `executable()` says whether a command can start in the pod, so the kubelet
fails a container whose program the pod cannot see at once, with the runtime's message, instead of
letting it exit with a status nobody explains.
`/etc/hosts` is the pod's own file too, so Service names (`<job>-master-0`) resolve, and the pod has its own
UTS namespace whose hostname is the pod's name, as in a real pod (torchrun's c10d rendezvous decides
which agent hosts the store, and which address its workers meet at, from the hostname). The command
runs as the container's user (`setpriv`), e.g. uid 1000 as the alignflow images declare. Nothing a
pod writes is visible to another.

A pod whose image was really built (`make test-images`: an `ImageRoot`, the image's filesystem as buildah
mounts it) runs on that image instead: its root is an overlay whose lower layer is the image and whose upper
layer is the pod's own (a container's writable layer), with this machine's /dev, /proc and /sys and the pod's
own `/tmp`, `/run` and KFP artifact mounts over it; `/home` and `/root` are the image's, and the command starts
in the image's WORKDIR (the kubelet puts the image's environment under the container's).

What it leaves out: the network namespace is the host's (pods reach loopback servers, and ports
are shared), and there are no cgroups. It needs root (CAP_SYS_ADMIN for mounts, chown and setuid);
elsewhere the tests that use it skip, saying why.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

# Folders each pod gets of its own; every other top-level entry of `/` is bound from this machine.
POD_DIRS = ("tmp", "home", "root", "run", "workspace", "minio", "s3", "gcs")
MODES = {"tmp": 0o1777, "home": 0o755, "root": 0o755, "run": 0o755, "workspace": 0o755, "minio": 0o777, "s3": 0o777,
         "gcs": 0o777}


def _outermost(paths: list[str]) -> tuple[str, ...]:
    """`paths` without duplicates and without any path inside another one of them."""
    kept: list[str] = []
    for path in sorted({os.path.realpath(p) for p in paths if p}, key=len):
        if not any(path == other or path.startswith(other.rstrip("/") + "/") for other in kept):
            kept.append(path)
    return tuple(kept)


# What an image would contain, bound into every pod at the same path: the checkout (an editable install
# imports `trainer`, `components` and `pipelines` from it), the virtualenv, and the Python it was made
# from. A path under a folder the pod owns (a clone in /home or /tmp, pyenv in /root) would otherwise be
# hidden by that folder; one elsewhere is bound with the rest of `/` anyway.
CHECKOUT = str(Path(__file__).resolve().parents[2])
HOST_BINDS = _outermost([CHECKOUT, sys.prefix, sys.base_prefix, str(Path(sys.executable).resolve().parent)])
WORKDIR = "/workspace"
SERVICE_ACCOUNT_DIR = "run/secrets/kubernetes.io/serviceaccount"  # /var/run -> /run

# The pod's own folders when it runs on a built image, whose /home, /root and WORKDIR are its own.
IMAGE_POD_DIRS = ("tmp", "run", "minio", "s3", "gcs")

# Runs inside the new mount namespace: build the root, then exec the container's command in it.
_SETUP = r"""
root=$1; pod=$2; shift 2
if [ -n "$IMAGE_ROOT" ]; then
  mkdir -p "$pod/upper" "$pod/work"
  mount -t overlay overlay -o "lowerdir=$IMAGE_ROOT,upperdir=$pod/upper,workdir=$pod/work" "$root"
  for name in dev proc sys; do mkdir -p "$root/$name"; mount --rbind "/$name" "$root/$name"; done
  [ -e "$root/etc/hosts" ] || : > "$root/etc/hosts"
else
mount -t tmpfs -o mode=755 pod-root "$root"
for entry in /* /.dockerenv; do
  [ -e "$entry" ] || [ -L "$entry" ] || continue
  name=${entry#/}
  case " $POD_DIRS " in *" $name "*) continue;; esac
  if [ -L "$entry" ]; then ln -s "$(readlink "$entry")" "$root/$name"
  elif [ -d "$entry" ]; then mkdir "$root/$name"; mount --rbind "$entry" "$root/$name"
  else : > "$root/$name"; mount --bind "$entry" "$root/$name"; fi
done
fi
for name in $POD_DIRS; do mkdir -p "$root/$name"; mount --bind "$pod/fs/$name" "$root/$name"; done
for volume in $VOLUMES; do mkdir -p "$root${volume#*=}"; mount --bind "${volume%%=*}" "$root${volume#*=}"; done
for path in $READ_ONLY; do mount -o remount,bind,ro "$root$path"; done
mount --bind "$pod/hosts" "$root/etc/hosts"
if [ -n "$POD_HOSTNAME" ]; then hostname "$POD_HOSTNAME"; fi
for path in $HOST_BINDS; do mkdir -p "$root$path"; mount --rbind "$path" "$root$path"; done
if [ "$RUN_AS" = "0:0" ]; then exec chroot "$root" /usr/bin/env -i -C "$WORKDIR" "$@"; fi
exec chroot "$root" setpriv --reuid "${RUN_AS%:*}" --regid "${RUN_AS#*:}" --clear-groups /usr/bin/env -i -C "$WORKDIR" "$@"
"""


@dataclass(frozen=True)
class ImageRoot:
    """A built image, as a pod runs it: its filesystem (mounted by the builder) and its config."""

    path: Path
    env: dict[str, str]  # the image's ENV; the container's own variables win over it
    workdir: str
    user: tuple[int, int, str]  # uid, gid and HOME of its USER


# `make test-images` names its built images in this file (JSON: image -> ImageRoot fields), so the emulated cluster
# runs pods of those images on them.
BUILT_IMAGES_VARIABLE = "ALIGNFLOW_TEST_IMAGES"


def built_images() -> dict[str, ImageRoot]:
    """The images `make test-images` built and mounted (none unless it runs these tests)."""
    listing = os.environ.get(BUILT_IMAGES_VARIABLE)
    if not listing:
        return {}
    return {name: ImageRoot(Path(item["path"]), item["env"], item["workdir"], tuple(item["user"]))
            for name, item in json.loads(Path(listing).read_text()).items()}


class SandboxUnavailable(RuntimeError):
    """This machine cannot create mount namespaces (no root and no user namespaces)."""


def _unshare_prefix() -> list[str]:
    return ["unshare", "--mount", "--uts", "--propagation", "private"]


def check_available() -> None:
    """Raise SandboxUnavailable (with the reason) unless pods can be sandboxed here."""
    if os.geteuid() != 0:
        raise SandboxUnavailable("it needs root: a pod's folders are handed to its image's user (uid 1000) and its "
                                 "process runs as that user, which an unprivileged user namespace cannot map")
    if shutil.which("unshare") is None or shutil.which("chroot") is None or shutil.which("setpriv") is None:
        raise SandboxUnavailable("util-linux `unshare` and `setpriv` and coreutils `chroot` are needed")
    probe = subprocess.run([*_unshare_prefix(), "sh", "-c", "mount -t tmpfs probe /mnt"], capture_output=True,
                           text=True)
    if probe.returncode != 0:
        raise SandboxUnavailable(f"cannot create a mount namespace: {probe.stderr.strip()}")


class PodFilesystem:
    """The host-side folders of one pod, and the command line that runs a container in them."""

    def __init__(self, base: Path, hosts: dict[str, str] | None = None, hostname: str = "",
                 image: ImageRoot | None = None, volumes: dict[str, Path] | None = None,
                 read_only: set[str] | frozenset[str] = frozenset()) -> None:
        self.base = base
        self.hostname = hostname
        self.image = image
        self.volumes = dict(volumes or {})  # mount path in the pod -> a folder on this machine (a PVC, say)
        self.read_only = set(read_only)  # mount paths of `volumes` mounted read-only (`readOnly: true`)
        self.uid, self.gid = 0, 0
        for name in POD_DIRS:
            (base / "fs" / name).mkdir(parents=True, exist_ok=True)
            (base / "fs" / name).chmod(MODES[name])
        (base / "mnt").mkdir(exist_ok=True)
        # The kubelet writes the pod's own hostname into its /etc/hosts too.
        hosts = {**({hostname: "127.0.0.1"} if hostname else {}), **(hosts or {})}
        lines = ["127.0.0.1 localhost", *(f"{address} {name}" for name, address in hosts.items())]
        (base / "hosts").write_text("\n".join(lines) + "\n")

    def host_path(self, pod_path: str) -> Path:
        """Where a path inside the pod (one of the pod's own folders) is on this machine."""
        relative = Path(pod_path).relative_to("/")
        if relative.parts[:1] == ("var",) and relative.parts[1:2] == ("run",):
            relative = Path("run", *relative.parts[2:])
        if not relative.parts or relative.parts[0] not in POD_DIRS:
            raise ValueError(f"{pod_path} is not in one of the pod's own folders {POD_DIRS}")
        return self.base / "fs" / relative

    def run_as(self, uid: int, gid: int, home: str) -> None:
        """The container's user, and its HOME (created, owned by it)."""
        self.uid, self.gid = uid, gid
        if self.image is None:  # an image brings its user's HOME
            self.make_owned(self.host_path(home))

    def make_owned(self, path: Path) -> None:
        """Create `path` (a folder in the pod's own folders) and hand it, and what is below, to the pod's user."""
        path.mkdir(parents=True, exist_ok=True)
        top = self.base / "fs"
        for item in [path, *path.rglob("*")]:
            os.chown(item, self.uid, self.gid)
        for parent in path.parents:
            if parent == top or top not in parent.parents:
                break
            if parent.parent != top:  # the pod's top-level folders keep their owner and mode
                os.chown(parent, self.uid, self.gid)

    def mount_service_account(self, namespace: str, token: str, ca_pem: bytes) -> None:
        """What the kubelet mounts at /var/run/secrets/kubernetes.io/serviceaccount."""
        folder = self.base / "fs" / SERVICE_ACCOUNT_DIR
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "namespace").write_text(namespace)
        (folder / "token").write_text(token)
        (folder / "ca.crt").write_bytes(ca_pem)

    def visible(self, pod_path: str) -> Path | None:
        """Where a path inside the pod is on this machine, or None when the pod cannot see it."""
        path = os.path.normpath(pod_path)
        if self.image:
            return self._in_image(path)
        if any(path == bind or path.startswith(bind + "/") for bind in HOST_BINDS):
            return Path(path)
        top = path.lstrip("/").split("/", 1)[0]
        if top in POD_DIRS or (top == "var" and path.startswith("/var/run/")):
            return self.host_path(path)
        return Path(path)

    def _in_image(self, path: str) -> Path | None:
        """Where `path` of a pod running on a built image is on this machine: its own folders, or the image's
        file, following the image's symlinks inside the image (as they resolve in the pod)."""
        top = path.lstrip("/").split("/", 1)[0]
        if top in IMAGE_POD_DIRS:
            return self.host_path(path)
        resolved = Path("/")
        pending = list(Path(path).parts[1:])
        for _ in range(64):  # a symlink loop ends in "not visible", as ELOOP in the runtime
            if not pending:
                return self.image.path / resolved.relative_to("/")
            part = pending.pop(0)
            candidate = resolved.parent if part == ".." else resolved / part
            on_host = self.image.path / candidate.relative_to("/")
            if on_host.is_symlink():
                target = os.readlink(on_host)
                pending = [*Path(target).parts[1 if target.startswith("/") else 0:], *pending]
                resolved = Path("/") if target.startswith("/") else resolved
            else:
                resolved = candidate
        return None

    def executable(self, program: str, search_path: str) -> str | None:
        """The pod's path of `program` as its container runtime would find it (on `search_path` unless it
        names a path), or None when nothing executable by that name is visible in the pod."""
        candidates = [program] if "/" in program else [f"{folder}/{program}" for folder in search_path.split(":")
                                                       if folder.startswith("/")]
        for candidate in candidates:
            workdir = self.image.workdir if self.image else WORKDIR
            where = self.visible(candidate if candidate.startswith("/") else f"{workdir}/{candidate}")
            if where is not None and where.is_file() and os.access(where, os.X_OK):
                return candidate
        return None

    def command(self, argv: list[str], env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
        """(argv, env) for Popen: `argv` run in the pod's root with exactly `env`, from /workspace."""
        assignments = [f"{key}={value}" for key, value in env.items()]
        outer_env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "POD_DIRS": " ".join(POD_DIRS), "WORKDIR": WORKDIR,
                     "RUN_AS": f"{self.uid}:{self.gid}", "HOST_BINDS": " ".join(HOST_BINDS),
                     "POD_HOSTNAME": self.hostname, "IMAGE_ROOT": "",
                     "VOLUMES": " ".join(f"{host}={path}" for path, host in self.volumes.items()),
                     "READ_ONLY": " ".join(sorted(self.read_only))}
        if self.image:  # the image holds the project, the venv and Python: nothing of this machine's is bound
            outer_env.update(POD_DIRS=" ".join(IMAGE_POD_DIRS), WORKDIR=self.image.workdir, HOST_BINDS="",
                             IMAGE_ROOT=str(self.image.path))
        return ([*_unshare_prefix(), "sh", "-ec", _SETUP, "pod-setup", str(self.base / "mnt"), str(self.base),
                 *assignments, *argv], outer_env)
