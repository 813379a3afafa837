"""The Markdown report of one stage for the KFP UI: final metrics, curves, samples, the MLflow run, the config.

It reads what the stage's job left under its `job_root` (`metrics.jsonl`, `samples.jsonl`,
`mlflow_run.json`); the launcher (`components/stage_io.py`) writes it to the
component's `report` output.
"""

from __future__ import annotations

import json

import yaml

from components.reports.warnings import warnings_markdown
from trainer.storage import get_storage, join_uri
from trainer.tracking.history import parse_records


def sparkline(values: list[float]) -> str:
    """A one-line plot of a curve, for Markdown reports."""
    if not values:
        return ""
    bars = "▁▂▃▄▅▆▇█"
    low, high = min(values), max(values)
    span = (high - low) or 1.0
    step = max(1, len(values) // 60)
    return "".join(bars[int((v - low) / span * (len(bars) - 1))] for v in values[::step])


def stage_report(stage: str, config: dict, metrics: dict[str, float], job_root: str) -> str:
    """Markdown for the KFP UI: final metrics, curves of the logged metrics, the resolved config."""
    storage = get_storage(job_root)
    history_uri = join_uri(job_root, "metrics.jsonl")
    # A line a kill cut short (or a blank one) is left out, as everywhere the history is read: the report of a
    # finished stage must not fail on it.
    history = parse_records(storage.read_bytes(history_uri).decode(errors="replace")) \
        if storage.exists(history_uri) else []
    lines = [f"# {stage}", *warnings_markdown(metrics), "", "| metric | value |", "|---|---|"]
    lines += [f"| {key} | {value:.4g} |" for key, value in sorted(metrics.items()) if isinstance(value, (int, float))]
    curves = ["loss", "episode/reward_mean", "episode/kl_to_ref", "eval/loss", "eval/accuracy"]
    lines += ["", "## Curves", ""]
    for key in curves:
        values = [row[key] for row in history if key in row]
        if len(values) > 1:
            lines.append(f"- `{key}` {values[0]:.3g} `{sparkline(values)}` {values[-1]:.3g}")
    lines += time_breakdown(history)
    samples_uri = join_uri(job_root, "samples.jsonl")
    if storage.exists(samples_uri):
        samples = parse_records(storage.read_bytes(samples_uri).decode(errors="replace"))
        lines += ["", "## Sample generations (last episode)", "", "| prompt | response | score |", "|---|---|---|"]
        lines += [f"| {table_cell(s['prompt'])} | {table_cell(s['response'])} | {s['score']:.3g} |" for s in samples]
    run_uri = join_uri(job_root, "mlflow_run.json")
    if storage.exists(run_uri):
        run = json.loads(storage.read_bytes(run_uri))
        from components.reports.links import stage_run_link  # ALIGNFLOW_MLFLOW_EXTERNAL_URL when set

        link = stage_run_link(run)
        where = f"[{run['run_id']}]({link})" if link else f"`{run['run_id']}` in `{run['tracking_uri']}`"
        lines += ["", f"MLflow run: {where}"]
    lines += ["", "## Config", "", "```yaml", yaml.safe_dump(config, sort_keys=False).strip(), "```"]
    return "\n".join(lines) + "\n"


def time_breakdown(history: list[dict]) -> list[str]:
    """Markdown lines: where an online stage's steps spent their time (the `perf/time/*` keys every online step
    logs, summed over the steps), and its throughput over all of them; nothing for a stage without them."""
    steps = [row for row in history if "perf/time/step" in row]
    if not steps:
        return []
    total = sum(row["perf/time/step"] for row in steps)
    phases = sorted({key for row in steps for key in row if key.startswith("perf/time/") and key != "perf/time/step"})
    seconds = {key.removeprefix("perf/time/"): sum(row.get(key, 0.0) for row in steps) for key in phases}
    completions = sum(row["perf/completions_per_second"] * row["perf/time/step"] for row in steps)
    lines = ["", f"## Where the time went ({len(steps)} steps, {total:.1f} s, {completions / total:.3g} completions/s)",
             "", "| phase | seconds | share |", "|---|---|---|"]
    lines += [f"| {name} | {value:.2f} | {value / total:.0%} |" for name, value in seconds.items() if value > 0]
    return lines


def table_cell(text: str) -> str:
    """Text safe inside a Markdown table cell."""
    return str(text).replace("|", "\\|").replace("\n", " ")[:200]
