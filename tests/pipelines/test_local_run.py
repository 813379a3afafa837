"""The closing summary of `alignflow run`."""

from __future__ import annotations


def test_the_closing_summary_keeps_its_columns_aligned_for_long_task_names():
    from pipelines.local_run import format_summary

    summary = {"sft": {"seconds": 3.25, "metrics": {"eval_loss": 0.5}, "model": "/root/sft/model"},
               "train-reward-model-with-a-long-name": {"seconds": 112.0, "metrics": {"eval_accuracy": 0.95,
                                                                                    "eval_loss": 0.25},
                                                       "model": "/root/rm/model"},
               "finish-run": {"seconds": 0.5, "metrics": {}, "model": ""}}
    lines = format_summary(summary, 116.0).splitlines()
    header, rows = lines[0], lines[1:-1]
    # Every column starts where its header does: time right-aligned under `time`, metrics and model under theirs.
    for column in ("key metrics", "model"):
        start = header.index(column)
        assert all(row[start - 2:start] == "  " and row[start] != " " for row in rows if len(row) > start), column
    time_end = header.index("time") + len("time")
    assert [row[:time_end].split()[-1] for row in rows] == ["3.2s", "112.0s", "0.5s"]
    assert lines[-1] == "total 116 s"


def test_the_evaluation_row_shows_each_gate_with_its_bound_and_decision():
    from pipelines.local_run import format_summary

    metrics = {"reward": 0.8, "baseline_reward": 0.3, "gate/difference": 0.5, "gate/lower_bound": 0.3125,
               "gate/confidence": 0.95, "gate/opens": 1.0, "champion_gate/difference": 0.1,
               "champion_gate/lower_bound": -0.05, "champion_gate/confidence": 0.95, "champion_gate/opens": 0.0,
               "champion_gate/guard/reward/holds": 0.0, "champion_gate/guard/response_tokens/holds": 1.0}
    row = format_summary({"evaluate-model": {"seconds": 9.0, "metrics": metrics, "model": ""}}, 9.0).splitlines()[1]
    assert "gate: +0.500 >= +0.312 at 95%: opens" in row
    assert "gate vs champion: +0.100 >= -0.050 at 95%: refused (guard reward fell)" in row
