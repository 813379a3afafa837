"""A stage's warnings head both of its reports; a stage without any shows no warnings section."""

from __future__ import annotations

from components.reports.curves import stage_html
from components.reports.stage import stage_report

WARNING = "loss did not fall over the run: 4.624 over the first 6 logged points, 4.615 over the last 6 <steps>"


def test_warnings_open_the_markdown_report_and_the_html_page(tmp_path):
    final = {"loss": 4.615, "warnings": [WARNING]}
    markdown = stage_report("sft", {}, final, str(tmp_path))
    assert markdown.startswith(f"# sft\n\n## Warnings\n\n- **Warning:** {WARNING}\n")
    assert "| warnings |" not in markdown  # not a metric row
    page = stage_html("sft", final, str(tmp_path), environ={})
    assert "<h2>Warnings</h2><ul><li class='worse'>loss did not fall over the run" in page
    assert "&lt;steps&gt;" in page  # escaped


def test_a_stage_without_warnings_has_no_warnings_section(tmp_path):
    assert "Warnings" not in stage_report("sft", {}, {"loss": 1.0}, str(tmp_path))
    assert "Warnings" not in stage_html("sft", {"loss": 1.0}, str(tmp_path), environ={})
