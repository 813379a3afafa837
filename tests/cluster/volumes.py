"""The volumes the emulated kubelet sets up besides the service account's and the projected ones (`projected.py`).

- A Secret volume mounted under the pod's own `/run` (`/var/run/...`) gets the Secret's keys as files (or the
  volume's `items`), read-only; a Secret that does not exist raises VolumeError (the pod stays ContainerCreating
  with the kubelet's FailedMount event), unless the volume is optional.
- A `persistentVolumeClaim` volume is a folder of this machine per claim (`<pods dir>/claims/<namespace>_<claim>`,
  as if a provisioner had bound it), kept while the cluster runs and shared by every pod that mounts the claim,
  read-only where the mount says `readOnly`; with the pod's `fsGroup` it is the group's and group-writable
  (setgid), as the kubelet makes a volume that supports ownership management.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from tests.cluster.store import NotFound, Store

if TYPE_CHECKING:
    from tests.cluster.sandbox import PodFilesystem


def secret_data(kind: str, obj: dict) -> dict[str, str]:
    import base64

    if kind == "secrets":
        decoded = {k: base64.b64decode(v).decode() for k, v in (obj.get("data") or {}).items()}
        return {**decoded, **(obj.get("stringData") or {})}
    return dict(obj.get("data") or {})


class VolumeError(Exception):
    """A volume cannot be set up yet (FailedMount): the pod stays ContainerCreating."""


def mount_secret_volumes(store: Store, pod: dict, container: dict, fs: PodFilesystem) -> None:
    """Write the files of every Secret volume the container mounts. Raises VolumeError (a missing Secret)."""
    volumes = {volume["name"]: volume for volume in pod["spec"].get("volumes") or []}
    for mount in container.get("volumeMounts") or []:
        source = volumes.get(mount["name"], {}).get("secret")
        if source is None:
            continue
        try:
            secret = secret_data("secrets", store.get("secrets", pod["metadata"]["namespace"], source["secretName"]))
        except NotFound:
            if source.get("optional"):
                continue
            raise VolumeError(f'MountVolume.SetUp failed for volume "{mount["name"]}" : secret '
                              f'"{source["secretName"]}" not found') from None
        items = source.get("items") or [{"key": key, "path": key} for key in secret]
        folder = fs.host_path(mount["mountPath"])
        folder.mkdir(parents=True, exist_ok=True)
        for item in items:
            if item["key"] not in secret:
                if source.get("optional"):
                    continue
                raise VolumeError(f'MountVolume.SetUp failed for volume "{mount["name"]}" : references non-existent '
                                  f'secret key: {item["key"]}')
            (folder / item["path"]).write_text(secret[item["key"]])
            os.chmod(folder / item["path"], 0o644)


def claim_volumes(pod: dict, claims_dir: Path) -> tuple[dict[str, Path], set[str]]:
    """({mount path: folder}, read-only mount paths) of the claims the pod's container mounts (see the docstring)."""
    volumes = {volume["name"]: volume for volume in pod["spec"].get("volumes") or []}
    group = (pod["spec"].get("securityContext") or {}).get("fsGroup")
    mounts, read_only = {}, set()
    for mount in pod["spec"]["containers"][0].get("volumeMounts") or []:
        claim = (volumes.get(mount["name"]) or {}).get("persistentVolumeClaim")
        if claim is None:
            continue
        folder = claims_dir / f"{pod['metadata']['namespace']}_{claim['claimName']}"
        if not folder.exists():
            folder.mkdir(parents=True)
            if group is not None:
                os.chown(folder, 0, int(group))
                folder.chmod(0o2775)
        mounts[mount["mountPath"]] = folder
        if mount.get("readOnly") or claim.get("readOnly"):
            read_only.add(mount["mountPath"])
    return mounts, read_only
