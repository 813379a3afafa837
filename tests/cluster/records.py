"""What the emulated cluster recorded, as the initializer tests read it: the object store's GETs of a model's
weights (moto's request log) and each pod's log of a TrainJob."""

from __future__ import annotations

import uuid
from pathlib import Path

from tests.cluster.cluster import Cluster
from tests.cluster.conftest import DATA_BUCKET
from tests.cluster.kfp_runner import ObjectStore

MODEL_FILE = "model.safetensors"


def request_log(store: ObjectStore, folder: Path) -> Path:
    """The request log of the `object_store` fixture's moto server (the one that logs a request of ours)."""
    probe = f"probe-{uuid.uuid4().hex}"
    store.client.put_object(Bucket=DATA_BUCKET, Key=probe, Body=b"")
    [log] = [path for path in folder.glob("moto[0-9]*/moto.log") if probe in path.read_text()]
    return log


def weight_reads(moto_log: Path, model_uri: str, offset: int = 0) -> int:
    """GETs of the weights of the model at `model_uri` (s3:// or minio://) the object store answered since `offset`
    (its request log: moto.log)."""
    bucket, key = ObjectStore.split(f"{model_uri.rstrip('/')}/{MODEL_FILE}")
    with moto_log.open() as handle:
        handle.seek(offset)
        return sum(f'"GET /{bucket}/{key} ' in line for line in handle)


def logs(cluster: Cluster, job: str) -> dict[str, str]:
    """Each pod's log by its replicated job (`dataset-initializer`, `model-initializer`, `node`)."""
    found = {}
    for (_, pod), runtime in {**cluster.kubelet.removed, **cluster.kubelet.runtimes}.items():
        if pod.startswith(f"{job}-"):
            found[pod[len(job) + 1:].rsplit("-", 3)[0]] = runtime.log.text  # <job>-<replicated job>-0-0-<suffix>
    return found
