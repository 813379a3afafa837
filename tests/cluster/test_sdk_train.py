"""An alignflow stage run from the Kubeflow SDK alone, without KFP: the call of docs/kubeflow.md, on the emulated cluster.

The platform team installed the chart with its runtime cluster-wide (`training.runtime.kind:
ClusterTrainingRuntime`, so the SDK finds it after looking in the namespace) and the S3 Secret; a user
uploads a stage config to S3 and calls `TrainerClient.train` with `stage_trainjob_arguments`. The
trainer pod reads the config, the tiny model and the data from the object store, and writes its
metrics and model there. About 11 s on 2 cores.
"""

from __future__ import annotations

import json

from tests.cluster.cluster import Cluster
from tests.cluster.conftest import (
    DATA_BUCKET,
    IMAGE_USERS,
    KINDS,
    NAMESPACE,
    S3_SECRET,
    chart_values,
    emulated_nodes,
    render_chart,
)
from tests.cluster.kfp_runner import ObjectStore
from tests.integration.services import S3_ENV

RUNTIME = "af-alignflow-torch"  # the chart's runtime for release `af`
MAX_STEPS = 4


def install_cluster_runtime(cluster: Cluster, endpoint: str) -> None:
    """The chart's runtime as a ClusterTrainingRuntime, and the S3 Secret in the user's namespace."""
    values = chart_values(endpoint)
    values["training"]["runtime"]["kind"] = "ClusterTrainingRuntime"
    [runtime] = [m for m in render_chart(values, cluster.api_versions()) if m["kind"] == "ClusterTrainingRuntime"]
    cluster.apply(runtime, NAMESPACE)
    cluster.create_namespace_objects(NAMESPACE, secrets_={S3_SECRET: {
        "AWS_ACCESS_KEY_ID": S3_ENV["AWS_ACCESS_KEY_ID"], "AWS_SECRET_ACCESS_KEY": S3_ENV["AWS_SECRET_ACCESS_KEY"]}})


def test_a_stage_runs_from_the_kubeflow_sdks_train_call_on_the_charts_runtime(sandbox, object_store, tiny_inputs,
                                                                              tmp_path):
    import yaml
    from kubeflow.common.types import KubernetesBackendConfig
    from kubeflow.trainer import TrainerClient
    from transformers import AutoModelForCausalLM

    from components.launcher.kinds.trainjob.sdk_call import stage_trainjob_arguments
    from components.launcher.stage_job import ClusterOptions

    store = ObjectStore(object_store, S3_ENV)
    job_root = f"s3://{DATA_BUCKET}/sdk-sft"
    config = {"model": {"path": tiny_inputs["base_model_uri"]},
              "data": {"train_path": tiny_inputs["sft_train_uri"], "eval_path": None, "max_length": 32},
              "train": {"max_steps": MAX_STEPS, "micro_batch_size": 4, "log_interval": 1, "num_threads": 1},
              "tracking": {"backend": "none"},
              "output_dir": job_root, "export_dir": f"{job_root}/model"}
    store.client.put_object(Bucket=DATA_BUCKET, Key="sdk-sft/sft.yaml", Body=yaml.safe_dump(config).encode())
    cluster_options = ClusterOptions(mode="kubernetes", image="ghcr.io/alignflow/trainer:test", namespace=NAMESPACE,
                                     s3_secret=S3_SECRET, env={"AWS_ENDPOINT_URL": object_store,
                                                               "AWS_DEFAULT_REGION": "us-east-1",
                                                               "OMP_NUM_THREADS": "1"})

    with Cluster(tmp_path, emulated_nodes(), image_users=IMAGE_USERS, serves=KINDS["trainjob"].serves) as cluster:
        install_cluster_runtime(cluster, object_store)
        # The user's call (docs/kubeflow.md, "Running a stage from the Kubeflow SDK").
        client = TrainerClient(KubernetesBackendConfig(namespace=NAMESPACE,
                                                       client_configuration=cluster.client().configuration))
        name = client.train(runtime=RUNTIME, **stage_trainjob_arguments("sft", f"{job_root}/sft.yaml",
                                                                        cluster_options, name="my-sft",
                                                                        config=config))
        job = client.wait_for_job_status(name, status={"Complete", "Failed"}, timeout=120, polling_interval=1)
        logs = "\n".join(client.get_job_logs(name))
        assert job.status == "Complete", logs[-4000:]
        created = cluster.store.get("trainjobs", NAMESPACE, name)
        reference = created["spec"]["runtimeRef"]
        assert (reference["kind"], reference["name"]) == ("ClusterTrainingRuntime", RUNTIME)
        env = {item["name"]: item.get("value") for item in created["spec"]["trainer"]["env"]}
        # The credentials went as a Secret volume, which the trainer exports itself: never in the TrainJob.
        assert env["ALIGNFLOW_SECRET_ENV_DIRS"] == f"/var/run/secrets/alignflow/{S3_SECRET}"
        assert not {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} & set(env)

    bucket, key = store.split(f"{job_root}/final_metrics.json")
    final = json.loads(store.client.get_object(Bucket=bucket, Key=key)["Body"].read())
    assert final["global_step"] == MAX_STEPS, final
    store.download(f"{job_root}/model", tmp_path / "model")
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "model").num_parameters() > 0
