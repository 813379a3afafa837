"""A pod's filesystem on this machine: a private mount namespace with the paths a container would see.

Each emulated pod (a KFP component pod or a PyTorchJob replica) runs in a new mount namespace whose
root is a tmpfs holding bind mounts of this machine's top-level folders (so the same Python, venv
and project are there, as in an image), except for the folders a pod owns: `/tmp` (mode 1777),
`/home` (the image user's HOME), `/run` (where `/var/run/secrets/kubernetes.io/serviceaccount`
lives), `/workspace` (its empty working directory, root-owned like an image's WORKDIR) and KFP's
artifact mounts `/minio`, `/s3` and `/gcs` (world-writable, as KFP's emptyDir volumes); `/root`
is the pod's too, holding only this machine's Python (pyenv lives there). Those are
the pod's own folders on the host, so the emulator can play the KFP launcher: download input
artifacts into them before the container starts and upload outputs from them afterwards.
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
# This machine's Python lives below /root (pyenv), which a pod does not share: bind just that prefix.
INTERPRETER = sys.base_prefix if sys.base_prefix.startswith("/root/") else ""
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
mount --bind "$pod/hosts" "$root/etc/hosts"
if [ -n "$POD_HOSTNAME" ]; then hostname "$POD_HOSTNAME"; fi
if [ -n "$INTERPRETER" ]; then mkdir -p "$root$INTERPRETER"; mount --rbind "$INTERPRETER" "$root$INTERPRETER"; fi
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
                 image: ImageRoot | None = None, volumes: dict[str, Path] | None = None) -> None:
        self.base = base
        self.hostname = hostname
        self.image = image
        self.volumes = dict(volumes or {})  # mount path in the pod -> a folder on this machine (a PVC, say)
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

    def command(self, argv: list[str], env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
        """(argv, env) for Popen: `argv` run in the pod's root with exactly `env`, from /workspace."""
        assignments = [f"{key}={value}" for key, value in env.items()]
        outer_env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "POD_DIRS": " ".join(POD_DIRS), "WORKDIR": WORKDIR,
                     "RUN_AS": f"{self.uid}:{self.gid}", "INTERPRETER": INTERPRETER, "POD_HOSTNAME": self.hostname,
                     "IMAGE_ROOT": "", "VOLUMES": " ".join(f"{host}={path}" for path, host in self.volumes.items())}
        if self.image:
            outer_env.update(POD_DIRS=" ".join(IMAGE_POD_DIRS), WORKDIR=self.image.workdir, INTERPRETER="",
                             IMAGE_ROOT=str(self.image.path))
        return ([*_unshare_prefix(), "sh", "-ec", _SETUP, "pod-setup", str(self.base / "mnt"), str(self.base),
                 *assignments, *argv], outer_env)
