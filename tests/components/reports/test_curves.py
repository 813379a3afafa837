"""Stage curves as an HTML plot, and MLflow links that open in a browser."""

from __future__ import annotations

import json

import pytest

from components.reports.curves import curves, panel_of, stage_html
from components.reports.links import mlflow_base_url, stage_run_link


@pytest.mark.parametrize(("key", "panel"), [
    ("loss", "loss"), ("eval/loss", "loss"), ("episode/reward_mean", "reward"), ("rewards/margins", "reward"),
    ("eval/reward", "reward"), ("episode/kl_to_ref", "KL"), ("kl/approx", "KL"), ("lr", "learning rate"),
    ("rewards/accuracies", None), ("episode/kl_coef", None), ("perf/tokens_per_second", None),
])
def test_each_metric_goes_on_its_panel(key, panel):
    assert panel_of(key) == panel


def test_curves_keep_keys_with_two_points_in_panel_order():
    history = [{"step": 1, "loss": 2.0, "lr": 1e-3, "eval/loss": 2.1}, {"step": 2, "loss": 1.5, "lr": 5e-4},
               {"step": 3, "loss": None, "episode/kl_to_ref": 0.1}, {"step": 4, "episode/kl_to_ref": 0.2}]
    panels = curves(history)
    assert list(panels) == ["loss", "KL", "learning rate"]  # eval/loss has one point only
    assert panels["loss"] == {"loss": ([1, 2], [2.0, 1.5])}  # the null (non-finite) value is skipped
    assert panels["KL"]["episode/kl_to_ref"] == ([3, 4], [0.1, 0.2])


def test_stage_page_has_the_plot_final_metrics_and_an_external_mlflow_link(tmp_path):
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": 1 / s}) + "\n" for s in (1, 2, 3)))
    (tmp_path / "mlflow_run.json").write_text(json.dumps({"tracking_uri": "http://af-mlflow.ml:5000",
                                                          "experiment_id": "4", "run_id": "abc", "link": ""}))
    page = stage_html("sft", {"loss": 0.33, "eval/loss": 0.5}, str(tmp_path),
                      environ={"ALIGNFLOW_MLFLOW_EXTERNAL_URL": "https://mlflow.corp/"})
    assert "<img alt='curves' src='data:image/png;base64," in page
    assert "<td>eval/loss</td><td>0.5</td>" in page
    assert "href='https://mlflow.corp/#/experiments/4/runs/abc'" in page


def test_a_stage_without_curves_says_so(tmp_path):
    page = stage_html("rm", {}, str(tmp_path), environ={})
    assert "No curves" in page and "<img" not in page


@pytest.mark.parametrize(("tracking_uri", "environ", "base"), [
    ("http://af-mlflow.ml:5000", {}, "http://af-mlflow.ml:5000"),
    ("http://af-mlflow.ml:5000", {"ALIGNFLOW_MLFLOW_EXTERNAL_URL": "https://mlflow.corp"}, "https://mlflow.corp"),
    ("sqlite:///mlflow.db", {}, ""),
    ("https://user:pw@mlflow.corp", {}, "https://mlflow.corp"),
])
def test_links_prefer_the_external_url_and_never_carry_credentials(tracking_uri, environ, base):
    assert mlflow_base_url(tracking_uri, environ) == base


def test_stage_markdown_report_links_through_the_external_url(tmp_path, monkeypatch):
    from components.reports.stage import stage_report

    monkeypatch.setenv("ALIGNFLOW_MLFLOW_EXTERNAL_URL", "https://mlflow.corp")
    (tmp_path / "mlflow_run.json").write_text(json.dumps({"tracking_uri": "http://af-mlflow.ml:5000",
                                                          "experiment_id": "4", "run_id": "abc",
                                                          "link": "http://af-mlflow.ml:5000/#/experiments/4/runs/abc"}))
    assert "MLflow run: [abc](https://mlflow.corp/#/experiments/4/runs/abc)" in stage_report("sft", {}, {}, str(tmp_path))
    assert stage_run_link({"tracking_uri": "sqlite:///x.db", "experiment_id": "1", "run_id": "r", "link": ""}, {}) == ""


def test_stage_markdown_report_leaves_out_a_cut_or_blank_history_line(tmp_path):
    from components.reports.stage import stage_report

    lines = [json.dumps({"step": step, "loss": 2.0 - step / 4}) for step in (1, 2, 3)]
    (tmp_path / "metrics.jsonl").write_text("\n".join([lines[0], "", lines[1], lines[2], '{"step": 4, "lo']) + "\n")
    (tmp_path / "samples.jsonl").write_text(json.dumps({"prompt": "1+1=", "response": "2", "score": 1.0}) + "\n\n")
    report = stage_report("sft", {}, {"loss": 1.25}, str(tmp_path))
    assert "- `loss` 1.75 " in report and report.split("- `loss` ")[1].split("\n")[0].endswith(" 1.25")
    assert "| 1+1= | 2 | 1 |" in report


def test_stage_markdown_report_says_where_an_online_stages_time_went(tmp_path):
    from components.reports.stage import stage_report

    # Two episodes of 10 s and 30 s: generation 4 + 12, update 5 + 15, no reference; 8 completions each.
    rows = [{"step": 1, "perf/time/step": 10.0, "perf/time/generate": 4.0, "perf/time/update": 5.0,
             "perf/time/logps_ref": 0.0, "perf/completions_per_second": 0.8},
            {"step": 2, "perf/time/step": 30.0, "perf/time/generate": 12.0, "perf/time/update": 15.0,
             "perf/time/logps_ref": 0.0, "perf/completions_per_second": 8 / 30}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    report = stage_report("grpo", {}, {}, str(tmp_path))
    assert "## Where the time went (2 steps, 40.0 s, 0.4 completions/s)" in report
    assert "| generate | 16.00 | 40% |" in report and "| update | 20.00 | 50% |" in report
    assert "logps_ref" not in report  # a phase that never ran is left out
    assert "Where the time went" not in stage_report("sft", {}, {}, str(tmp_path / "nothing"))
