"""train_orpo called the way the KFP executor calls it, with the local launcher (a real `python -m trainer orpo`
job on the tiny task's pairs): the model, the metrics and the report. The whole rlhf-orpo pipeline is `slow`."""

from __future__ import annotations

from kfp import dsl

from components.orpo.component import train_orpo


def test_train_orpo_publishes_the_model_and_its_metrics(tmp_path, tiny_model, task_files):
    task = tmp_path / "train-orpo"
    task.mkdir()
    model = dsl.Model(uri=str(task / "model"))
    metrics, report = dsl.Metrics(uri=str(task / "metrics")), dsl.Markdown(uri=str(task / "report"))
    train_orpo.python_func(
        base_model=dsl.Model(uri=str(tiny_model)), train_dataset=dsl.Dataset(uri=str(task_files["pref_train"])),
        eval_dataset=dsl.Dataset(uri=str(task_files["pref_eval"])), model=model, metrics=metrics, report=report,
        curves=dsl.HTML(uri=str(task / "curves")), run_id="kfp-run-1", lr=5e-4, micro_batch_size=8, max_length=32,
        beta=0.25, launcher_mode="local", gpus_per_node=0, settings={"train.max_steps": 2, "train.num_threads": 1})

    assert (task / "model" / "model.safetensors").is_file() and model.metadata["stage"] == "orpo"
    assert {"loss", "nll_loss", "eval_log_odds_ratio"} <= set(metrics.metadata)
    assert "beta: 0.25" in open(report.path).read()
