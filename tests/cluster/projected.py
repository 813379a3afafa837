"""The kubelet's projected volumes: service-account tokens of a given audience, and ConfigMap items.

A real kubelet asks the API server for a token bound to the pod (TokenRequest) and refreshes it before it
expires; here `issue(namespace, pod, audience)` gives the token once (the emulated jobs are short). Other
projection sources (Secrets, downwardAPI, clusterTrustBundle) are not emulated.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from tests.cluster.store import NotFound, Store


class ProjectedVolumeError(Exception):
    """A projected source cannot be mounted (what the kubelet reports as FailedMount)."""


def mount_projected_volumes(store: Store, pod: dict, container: dict, fs,
                            issue: Callable[[str, str, str], str] | None) -> None:
    """Write the files of every projected volume the container mounts. Raises ProjectedVolumeError."""
    namespace, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
    volumes = {volume["name"]: volume for volume in pod["spec"].get("volumes") or []}
    for mount in container.get("volumeMounts") or []:
        projected = volumes.get(mount["name"], {}).get("projected")
        if projected is None:
            continue
        folder = fs.host_path(mount["mountPath"])
        folder.mkdir(parents=True, exist_ok=True)
        for source in projected.get("sources") or []:
            if "serviceAccountToken" in source:
                token = source["serviceAccountToken"]
                if issue is None:
                    raise ProjectedVolumeError(f'MountVolume.SetUp failed for volume "{mount["name"]}" : no token '
                                               "issuer for projected service-account tokens")
                _write(folder / token["path"], issue(namespace, name, token.get("audience", "")))
            elif "configMap" in source:
                _write_config_map(store, namespace, source["configMap"], folder, mount["name"])


def _write_config_map(store: Store, namespace: str, source: dict, folder, volume: str) -> None:
    try:
        data = store.get("configmaps", namespace, source["name"]).get("data") or {}
    except NotFound:
        if source.get("optional"):
            return
        raise ProjectedVolumeError(f'MountVolume.SetUp failed for volume "{volume}" : configmap "{source["name"]}" '
                                   "not found") from None
    for item in source.get("items") or [{"key": key, "path": key} for key in data]:
        if item["key"] in data:
            _write(folder / item["path"], data[item["key"]])


def _write(path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    os.chmod(path, 0o644)
