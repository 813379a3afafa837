"""A stage's curves as an HTML page with an inline plot: loss, reward, KL and learning rate against step.

Read from the stage's `metrics.jsonl` (one JSON object per logged step; the trainer's JsonlTracker).
Panels with no data are left out; each panel plots every logged key of its group that has at least
two points (`loss` and `eval/loss` share the loss panel). matplotlib is imported here only, with the
non-interactive Agg backend.
"""

from __future__ import annotations

import json
from typing import Any

from components.reports.html import escape, figure_png, link, number, page, table
from components.reports.links import stage_run_link
from components.reports.warnings import warnings_html
from trainer.storage import get_storage, join_uri
from trainer.tracking.history import parse_records

PANELS = ("loss", "reward", "KL", "learning rate")


def panel_of(key: str) -> str | None:
    """Which panel a metric key belongs on, or None (accuracy, throughput, ... are not plotted)."""
    leaf = key.rsplit("/", 1)[-1]
    if key == "lr" or leaf in ("lr", "learning_rate"):
        return "learning rate"
    if "kl" in key.split("/") or leaf.startswith("kl") or "kl_to" in leaf:
        return None if "coef" in leaf else "KL"
    if "reward" in key and "accurac" not in key:
        return "reward"
    if leaf == "loss" or key.startswith("loss/"):
        return "loss"
    return None


def curves(history: list[dict[str, Any]]) -> dict[str, dict[str, tuple[list[int], list[float]]]]:
    """{panel: {key: (steps, values)}} of the keys with at least two finite points."""
    series: dict[str, tuple[list[int], list[float]]] = {}
    for row in history:
        step = row.get("step")
        for key, value in row.items():
            if key == "step" or not isinstance(value, (int, float)) or isinstance(value, bool) or value != value:
                continue
            steps, values = series.setdefault(key, ([], []))
            steps.append(int(step) if isinstance(step, (int, float)) else len(steps))
            values.append(float(value))
    panels: dict[str, dict] = {}
    for key, (steps, values) in sorted(series.items()):
        panel = panel_of(key)
        if panel is not None and len(values) > 1:
            panels.setdefault(panel, {})[key] = (steps, values)
    return {panel: panels[panel] for panel in PANELS if panel in panels}


def plot(panels: dict[str, dict[str, tuple[list[int], list[float]]]], title: str) -> Any:
    """A matplotlib figure with one subplot per panel."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    columns = min(2, len(panels))
    rows = (len(panels) + columns - 1) // columns
    figure = Figure(figsize=(6 * columns, 3.2 * rows))
    for index, (panel, lines) in enumerate(panels.items(), start=1):
        axes = figure.add_subplot(rows, columns, index)
        for key, (steps, values) in lines.items():
            axes.plot(steps, values, label=key, marker="." if len(values) < 30 else None)
        axes.set_title(panel)
        axes.set_xlabel("step")
        axes.grid(alpha=0.3)
        axes.legend(fontsize="small")
    figure.suptitle(title)
    return figure


def read_jsonl(uri: str) -> list[dict]:
    storage = get_storage(uri)
    return parse_records(storage.read_bytes(uri).decode(errors="replace")) if storage.exists(uri) else []


def stage_html(stage: str, final: dict[str, Any], job_root: str, environ: dict[str, str] | None = None) -> str:
    """The HTML page of a finished stage: its warnings, curves, final metrics and MLflow run link."""
    history = read_jsonl(join_uri(job_root, "metrics.jsonl"))
    panels = curves(history)
    body = warnings_html(final)
    body.append(figure_png(plot(panels, stage)) if panels else "<p class='note'>No curves: fewer than two logged "
                                                               "points of loss, reward, KL or learning rate.</p>")
    run_file = join_uri(job_root, "mlflow_run.json")
    storage = get_storage(job_root)
    if storage.exists(run_file):
        location = json.loads(storage.read_bytes(run_file))
        body.append(f"<p>MLflow run: {link(stage_run_link(location, environ), location.get('run_id', '?'))}</p>")
    rows = [[escape(key), number(value)] for key, value in sorted(final.items()) if isinstance(value, (int, float))]
    body += ["<h2>Final metrics</h2>", table(["metric", "value"], rows)]
    return page(f"{stage}: training curves", body)


def write_stage_html(path: str, stage: str, final: dict[str, Any], job_root: str) -> None:
    """Write `stage_html` to `path` (a component's Output[HTML])."""
    with open(path, "w") as handle:
        handle.write(stage_html(stage, final, job_root))
