from components.launcher.kinds.trainjob.initializers import plan_initializers


def test_an_s3_model_and_its_data_are_fetched_by_the_initializers_and_read_from_the_shared_volume():
    config = {"model": {"path": "s3://models/tiny/"}, "data": {"train_path": "s3://data/dpo/train.jsonl",
                                                              "eval_path": "s3://data/dpo/eval.jsonl"}}
    rewritten, initializer = plan_initializers(config, s3_secret="s3-creds", s3_env={"ENDPOINT": "http://s3:9000"})
    assert rewritten == {"model": {"path": "/workspace/model"},
                         "data": {"train_path": "/workspace/dataset/train.jsonl",
                                  "eval_path": "/workspace/dataset/eval.jsonl"}}
    s3 = {"env": [{"name": "ENDPOINT", "value": "http://s3:9000"}], "secretRef": {"name": "s3-creds"}}
    assert initializer == {"model": {"storageUri": "s3://models/tiny", **s3},
                           "dataset": {"storageUri": "s3://data/dpo", **s3}}
    assert config["model"]["path"] == "s3://models/tiny/"  # the caller's config is left alone


def test_hf_models_go_through_the_initializer_and_local_paths_change_nothing():
    rewritten, initializer = plan_initializers({"model": {"path": "hf://org/tiny"}, "data": {"train_path": "/d/t.jsonl"}})
    assert initializer == {"model": {"storageUri": "hf://org/tiny"}}
    assert rewritten["model"]["path"] == "/workspace/model" and rewritten["data"]["train_path"] == "/d/t.jsonl"
    config = {"model": {"path": "/models/tiny"}, "data": {"train_path": "s3://a/t.jsonl", "eval_path": "s3://b/e.jsonl"}}
    assert plan_initializers(config) == (config, None)  # two buckets: the trainer reads them itself
