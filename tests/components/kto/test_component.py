"""train_kto called the way the KFP executor calls it (artifacts with local URIs), with the local launcher (a real
`python -m trainer kto` job on the tiny task's unpaired rows, on 2 nodes, whose training and evaluation steps share
one KL reference point through a collective): the model, the metrics and the report. The whole rlhf-kto pipeline
is `slow` (tests/pipelines)."""

from __future__ import annotations

from kfp import dsl

from components.kto.component import train_kto


def test_train_kto_publishes_the_model_and_its_metrics(tmp_path, tiny_model, task_files):
    task = tmp_path / "train-kto"
    task.mkdir()
    model = dsl.Model(uri=str(task / "model"))
    metrics, report = dsl.Metrics(uri=str(task / "metrics")), dsl.Markdown(uri=str(task / "report"))
    train_kto.python_func(
        base_model=dsl.Model(uri=str(tiny_model)), train_dataset=dsl.Dataset(uri=str(task_files["kto_train"])),
        eval_dataset=dsl.Dataset(uri=str(task_files["kto_eval"])), model=model, metrics=metrics, report=report,
        curves=dsl.HTML(uri=str(task / "curves")), run_id="kfp-run-1", lr=5e-4, micro_batch_size=8, max_length=32,
        beta=1.0, undesirable_weight=1.5, launcher_mode="local", num_nodes=2, gpus_per_node=0,
        settings={"train.max_steps": 2, "train.num_threads": 1})

    assert (task / "model" / "model.safetensors").is_file() and model.metadata["stage"] == "kto"
    assert {"loss", "kl", "eval_kl", "eval_rewards_accuracies"} <= set(metrics.metadata)
    assert "undesirable_weight: 1.5" in open(report.path).read()  # the resolved config, parameters mapped onto it
