"""A DPO stage reads its base model and data through Kubeflow Trainer's initializers on the emulated cluster, and the
same stage without them falls back to the trainer's own S3 reading.

The platform team installed the chart with `training.initializers.enabled` (or not); the stage runs as a component
runs it on Kubernetes (`cluster_options` from the chart's ConfigMap, then `run_stage_job`): the launcher plans what
the initializers fetch, writes the config naming /workspace, and creates the TrainJob through the Kubeflow SDK with
its `initializer`. The emulated controller runs the runtime's `dataset-initializer` and `model-initializer` jobs
first (a stand-in image fetching from the test's object store with the env Trainer's builder and the chart give
them, tests/cluster/initializers.py), each into the JobSet's claim, and the trainer's node (which mounts the claim
read-only at /workspace) once both are Complete. hf:// cannot be fetched here: it is tested at the manifest level
(tests/components/launcher/kinds/trainjob/test_initializers.py). About 8 s each on 2 cores.

The whole rlhf-dpo run on the Trainer cluster (test_pipeline_run.py) has the initializers on too and checks each
stage's model initializer (SFT's Model artifact reaching DPO through it); this stage keeps what that run does not
check: the dataset initializer fetching a data file and the config naming its copy, the exact `spec.initializer` of
both steps, the claim's contents, and the fallback.
"""

from __future__ import annotations

import dataclasses
import json
import uuid

import pytest
import yaml

from tests.cluster.cluster import Cluster
from tests.cluster.conftest import (
    DATA_BUCKET,
    IMAGE_USERS,
    KINDS,
    NAMESPACE,
    chart_values,
    emulated_nodes,
    install_platform,
)
from tests.cluster.kfp_runner import ObjectStore
from tests.cluster.records import MODEL_FILE, logs, request_log, weight_reads
from tests.integration.services import S3_ENV

MAX_STEPS = 4


def stage_config(inputs: dict[str, str]) -> dict:
    return {"model": {"path": inputs["base_model_uri"]},
            "data": {"train_path": inputs["preference_train_uri"], "eval_path": None, "max_length": 32},
            "train": {"max_steps": MAX_STEPS, "micro_batch_size": 4, "log_interval": 1, "num_threads": 1},
            "tracking": {"backend": "none"}}


@pytest.mark.parametrize("initializers", [True, False], ids=["initializers", "fallback"])
def test_a_dpo_stage_reads_its_base_model_through_the_model_initializer(initializers, sandbox, object_store,
                                                                         tiny_inputs, tmp_path, monkeypatch,
                                                                         tmp_path_factory):
    from components.launcher.stage_job import run_stage_job
    from components.stage_io import cluster_options

    store = ObjectStore(object_store, S3_ENV)
    moto_log = request_log(store, tmp_path_factory.getbasetemp())
    offset = moto_log.stat().st_size
    job_root = f"s3://{DATA_BUCKET}/initializers-{uuid.uuid4().hex[:6]}/dpo"
    values = chart_values(object_store)
    values["training"]["initializers"] = {"enabled": initializers}
    with Cluster(tmp_path, emulated_nodes(), image_users=IMAGE_USERS, serves=KINDS["trainjob"].serves) as cluster:
        manifests = install_platform(cluster, object_store, values=values)
        # The component pod's environment: the chart's defaults ConfigMap.
        environ = next(m for m in manifests if m["kind"] == "ConfigMap")["data"]
        assert environ["ALIGNFLOW_INITIALIZERS"] == str(initializers).lower()
        options = cluster_options({"launcher_mode": "kubernetes", "trainer_image": "ghcr.io/alignflow/trainer:test",
                                   "num_nodes": 1, "gpus_per_node": 0}, environ)
        options = dataclasses.replace(options, namespace=NAMESPACE, env={**options.env, "OMP_NUM_THREADS": "1"})
        monkeypatch.setattr("components.launcher.follow.launcher.load_api_client", cluster.client)
        for variable, value in {**S3_ENV, "AWS_ENDPOINT_URL": object_store}.items():  # the component's S3 access
            monkeypatch.setenv(variable, value)
        final = run_stage_job("dpo", stage_config(tiny_inputs), model_uri=f"{job_root}/model", job_root=job_root,
                              run_id="run-1", task="dpo", cluster=options)
        [trainjob] = KINDS["trainjob"].created(cluster)
        name = trainjob["metadata"]["name"]
        pods = logs(cluster, name)
        claim = cluster.kubelet.pods_dir / "claims" / f"{NAMESPACE}_initializer-{name}"
        assert cluster.errors == []
    reads = weight_reads(moto_log, tiny_inputs["base_model_uri"], offset)

    assert final["global_step"] == MAX_STEPS, final
    read = yaml.safe_load(store.client.get_object(Bucket=DATA_BUCKET, Key=store.split(f"{job_root}/dpo.yaml")[1])
                          ["Body"].read())  # the config the trainer read
    assert json.loads(store.client.get_object(Bucket=DATA_BUCKET, Key=store.split(f"{job_root}/model/config.json")[1])
                      ["Body"].read())["model_type"]  # the stage's model, exported to S3 as ever
    if not initializers:  # the fallback: no initializer anywhere, the trainer reads S3 itself
        assert "initializer" not in trainjob["spec"] and set(pods) == {"node"}
        assert read["model"]["path"] == tiny_inputs["base_model_uri"]
        assert read["data"]["train_path"] == tiny_inputs["preference_train_uri"]
        assert reads >= 1  # by the trainer
        return
    train_file = tiny_inputs["preference_train_uri"].rsplit("/", 1)[1]
    s3_env = [{"name": "ENDPOINT", "value": object_store}, {"name": "REGION", "value": "us-east-1"}]
    assert trainjob["spec"]["initializer"] == {
        "model": {"storageUri": f"{tiny_inputs['base_model_uri']}/", "env": s3_env},
        "dataset": {"storageUri": tiny_inputs["preference_train_uri"], "env": s3_env}}
    # The trainer read the copies in the shared volume, never S3, for its model and data.
    assert read["model"]["path"] == "/workspace/model"
    assert read["data"]["train_path"] == f"/workspace/dataset/{train_file}"
    assert set(pods) == {"dataset-initializer", "model-initializer", "node"}
    assert f"Downloading models/tiny/{MODEL_FILE} to /workspace/model/{MODEL_FILE}" in pods["model-initializer"]
    assert f"to /workspace/dataset/{train_file}" in pods["dataset-initializer"]
    assert tiny_inputs["base_model_uri"] not in pods["node"]
    assert reads == 1  # by the model initializer, once
    assert (claim / "model" / MODEL_FILE).is_file() and (claim / "dataset" / train_file).is_file()
