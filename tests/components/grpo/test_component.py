"""train_grpo called the way the KFP executor calls it (artifacts with local URIs), with the local launcher
(a real `python -m trainer grpo` job on the tiny task): the trained model, the metrics and the report, whose
sample table is read from the samples the trainer left in the job's folder. The whole rlhf-grpo pipeline is
`slow` (tests/pipelines)."""

from __future__ import annotations

import json

from kfp import dsl

from components.grpo.component import train_grpo


def test_train_grpo_publishes_model_metrics_and_the_last_episodes_samples(tmp_path, tiny_model, task_files):
    task = tmp_path / "train-grpo"
    task.mkdir()
    model = dsl.Model(uri=str(task / "model"))
    metrics, report = dsl.Metrics(uri=str(task / "metrics")), dsl.Markdown(uri=str(task / "report"))
    curves = dsl.HTML(uri=str(task / "curves"))
    train_grpo.python_func(
        base_model=dsl.Model(uri=str(tiny_model)), train_dataset=dsl.Dataset(uri=str(task_files["prompts"])),
        eval_dataset=dsl.Dataset(uri=str(task_files["eval_prompts"])), model=model, metrics=metrics, report=report,
        curves=curves, run_id="kfp-run-1", reward_function="trainer.tiny.task:reward", lr=5e-4, num_episodes=2,
        num_generations=4, micro_batch_size=8, max_length=32, launcher_mode="local", gpus_per_node=0,
        settings={"grpo.rollout_batch_size": 2, "generation.max_new_tokens": 4, "train.num_threads": 1})

    assert (task / "model" / "model.safetensors").is_file() and model.metadata["stage"] == "grpo"
    assert "eval_reward" in metrics.metadata
    job = task / "job"  # the job's folder beside the model (components/stage_io.default_job_root)
    samples = [json.loads(line) for line in (job / "samples.jsonl").read_text().splitlines()]
    table = open(report.path).read().split("## Sample generations")[1].split("\n## ")[0]
    rows = [line for line in table.splitlines() if line.startswith("| ") and "=" in line]
    assert samples and len(rows) == len(samples)
    assert all(f"{sample['score']:.3g} |" in row for sample, row in zip(samples, rows))
    assert (task / "curves").read_text().startswith("<")
