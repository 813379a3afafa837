"""What Kubeflow Trainer's initializers fetch for a stage, the paths its config then names, and what is refused.

hf:// is tested here, at the manifest level, only: nothing here can download from the Hub (the emulated cluster's
initializer fetches s3:// from the test's object store, tests/cluster/test_initializers.py).
"""

from __future__ import annotations

import pytest

from components.launcher.kinds.trainjob.initializers import hf_problems, plan_initializers, sdk_initializer
from components.launcher.kinds.trainjob.request import build_trainjob_request
from components.launcher.stage_job import ClusterOptions, run_stage_job, stage_initializers, stage_spec
from trainer.errors import ConfigError

FILES = {"s3://data/dpo/train.jsonl", "s3://data/dpo/eval.jsonl", "s3://data/other/eval.jsonl"}


def is_file(uri: str) -> bool:
    return uri in FILES


def test_an_s3_model_and_its_data_are_fetched_by_the_initializers_and_read_from_the_shared_volume():
    config = {"model": {"path": "s3://models/tiny"}, "data": {"train_path": "s3://data/dpo/train.jsonl",
                                                              "eval_path": "s3://data/dpo/eval.jsonl"}}
    rewritten, initializer = plan_initializers(config, is_file=is_file, s3_env={"ENDPOINT": "http://s3:9000",
                                                                                "REGION": ""})
    assert rewritten == {"model": {"path": "/workspace/model"},
                         "data": {"train_path": "/workspace/dataset/train.jsonl",
                                  "eval_path": "/workspace/dataset/eval.jsonl"}}
    env = [{"name": "ENDPOINT", "value": "http://s3:9000"}]  # no credentials: the runtime maps the S3 Secret's
    # The model is a folder (the slash keeps models/tiny-2/ out); both files share one folder, fetched as one URI.
    assert initializer == {"model": {"storageUri": "s3://models/tiny/", "env": env},
                           "dataset": {"storageUri": "s3://data/dpo/", "env": env}}
    assert config["model"]["path"] == "s3://models/tiny"  # the caller's config is left alone


def test_kfp_minio_artifacts_are_fetched_as_s3_of_the_same_store():
    # A pipeline root on KFP's MinIO hands stages `minio://bucket/key` artifacts (the SFT model, prepared data).
    config = {"model": {"path": "minio://mlpipeline/v2/artifacts/rlhf-dpo/run/train-sft/model"},
              "data": {"train_path": "minio://mlpipeline/v2/artifacts/rlhf-dpo/run/prepare-inputs/dpo_train"}}
    rewritten, initializer = plan_initializers(config, is_file=lambda uri: False)
    assert initializer == {"model": {"storageUri": "s3://mlpipeline/v2/artifacts/rlhf-dpo/run/train-sft/model/"},
                           "dataset": {"storageUri": "s3://mlpipeline/v2/artifacts/rlhf-dpo/run/prepare-inputs/"
                                                     "dpo_train/"}}
    assert rewritten["model"]["path"] == "/workspace/model" and rewritten["data"]["train_path"] == "/workspace/dataset"


@pytest.mark.parametrize(("data", "uri", "rewritten"), [
    # Files in two folders: the initializer fetches the training file, the trainer reads eval from S3 itself.
    ({"train_path": "s3://data/dpo/train.jsonl", "eval_path": "s3://data/other/eval.jsonl"}, "s3://data/dpo/train.jsonl",
     {"train_path": "/workspace/dataset/train.jsonl", "eval_path": "s3://data/other/eval.jsonl"}),
    # A folder (an HF datasets directory): its contents are the dataset folder itself.
    ({"train_path": "s3://data/hf-dataset", "eval_path": None}, "s3://data/hf-dataset/",
     {"train_path": "/workspace/dataset", "eval_path": None}),
    # Only eval in S3.
    ({"train_path": "/local/train.jsonl", "eval_path": "s3://data/dpo/eval.jsonl"}, "s3://data/dpo/eval.jsonl",
     {"train_path": "/local/train.jsonl", "eval_path": "/workspace/dataset/eval.jsonl"}),
])
def test_one_uri_per_step_decides_which_data_the_initializer_fetches(data, uri, rewritten):
    config, initializer = plan_initializers({"model": {"path": "/models/tiny"}, "data": data}, is_file=is_file)
    assert initializer == {"dataset": {"storageUri": uri}} and config["data"] == rewritten
    assert config["model"]["path"] == "/models/tiny"


def test_hf_models_go_through_the_initializer_and_local_paths_change_nothing():
    rewritten, initializer = plan_initializers({"model": {"path": "hf://org/tiny"}, "data": {"train_path": "/d/t.jsonl"}},
                                               is_file=is_file)
    assert initializer == {"model": {"storageUri": "hf://org/tiny"}}
    assert rewritten["model"]["path"] == "/workspace/model" and rewritten["data"]["train_path"] == "/d/t.jsonl"
    config = {"model": {"path": "/models/tiny"}, "data": {"train_path": "/d/t.jsonl"}}
    assert plan_initializers(config, is_file=is_file) == (config, None)


def test_the_sdk_builds_the_trainjobs_initializer_hf_included():
    """The Kubeflow SDK's own conversion (what `TrainerClient.train` puts in `spec.initializer`)."""
    from kubeflow.trainer.backends.kubernetes.utils import get_dataset_initializer, get_model_initializer

    initializer = sdk_initializer({"model": {"storageUri": "s3://models/tiny/",
                                             "env": [{"name": "ENDPOINT", "value": "http://s3:9000"}]},
                                   "dataset": {"storageUri": "s3://data/dpo/"}})
    model = get_model_initializer(initializer.model).to_dict()
    assert model["storageUri"] == "s3://models/tiny/"
    # Fetched whole: no IGNORE_PATTERNS (the SDK's default would drop a pytorch_model.bin the trainer loads).
    assert model["env"] == [{"name": "ENDPOINT", "value": "http://s3:9000"}]
    assert get_dataset_initializer(initializer.dataset).to_dict() == {"storageUri": "s3://data/dpo/", "env": []}
    hub = get_model_initializer(sdk_initializer({"model": {"storageUri": "hf://org/tiny"}}).model).to_dict()
    assert hub["storageUri"] == "hf://org/tiny"
    assert hub["env"] == [{"name": "IGNORE_PATTERNS", "value": "*.msgpack,*.h5,*.bin,*.pt,*.pth"}]


CLUSTER = ClusterOptions(mode="kubernetes", image="ghcr.io/alignflow/trainer:1", namespace="team",
                         env={"AWS_ENDPOINT_URL": "http://minio:9000", "AWS_DEFAULT_REGION": "us-east-1"})


def test_a_trainjob_request_carries_the_initializer_and_a_pytorchjob_refuses_one():
    from components.launcher.kinds.pytorchjob.manifest import build_pytorchjob
    from trainer.errors import LaunchError

    spec = stage_spec("dpo", "s3://b/dpo.yaml", "run-1", "dpo", CLUSTER,
                      initializer={"model": {"storageUri": "hf://org/tiny"}})
    assert build_trainjob_request(spec).initializer.model.storage_uri == "hf://org/tiny"
    assert build_trainjob_request(stage_spec("dpo", "s3://b/dpo.yaml", "run-1", "dpo", CLUSTER)).initializer is None
    with pytest.raises(LaunchError, match="initializer: only a TrainJob's runtime runs"):
        build_pytorchjob(spec)


def test_hf_values_are_refused_where_nothing_can_fetch_them_naming_the_key():
    config = {"model": {"path": "hf://org/tiny"}, "data": {"train_path": "/d/t.jsonl"}}
    with pytest.raises(ConfigError, match=r"model.path is 'hf://org/tiny'.*ALIGNFLOW_INITIALIZERS is off"):
        stage_initializers(config, CLUSTER, "TrainJob")
    on = ClusterOptions(**{**{name: getattr(CLUSTER, name) for name in CLUSTER.__slots__}, "initializers": True})
    with pytest.raises(ConfigError, match="a PyTorchJob runs no initializers"):
        stage_initializers(config, on, "PyTorchJob")
    assert stage_initializers(config, on, "TrainJob")[1]["model"] == {"storageUri": "hf://org/tiny"}
    problems = hf_problems({"model": {"path": "hf://a/b"}, "data": {"eval_path": "hf://d/e"},
                            "dpo": {"ref_model_path": "hf://a/ref"}}, model_fetched=True)
    assert [problem.split(" is ")[0] for problem in problems] == ["data.eval_path", "dpo.ref_model_path"]
    assert "hf:// datasets are not read" in problems[0] and "only model.path may be hf://" in problems[1]


def test_a_local_run_refuses_an_hf_model_before_writing_anything(tmp_path):
    config = {"model": {"path": "hf://org/tiny"}, "data": {"train_path": "/d/t.jsonl"}}
    with pytest.raises(ConfigError, match="local mode runs no initializers"):
        run_stage_job("dpo", config, model_uri=None, job_root=str(tmp_path / "job"), run_id="r", task="dpo",
                      cluster=ClusterOptions(mode="local", image="ghcr.io/alignflow/trainer:1"))
    assert not (tmp_path / "job").exists()
