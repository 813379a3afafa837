"""A finished stage's warnings, shown at the top of its reports so they are not missed.

The trainer lists them under `warnings` in `final_metrics.json` (for example a loss that did not fall
over the run: `trainer.tracking.history`); they never fail a stage, the user decides.
"""

from __future__ import annotations

from typing import Any

from components.reports.html import escape


def stage_warnings(final: dict[str, Any]) -> list[str]:
    """The warning texts of a stage's final metrics ([] when there are none)."""
    found = final.get("warnings")
    return [str(text) for text in found] if isinstance(found, list) else []


def warnings_markdown(final: dict[str, Any]) -> list[str]:
    """Markdown lines of a `## Warnings` section, or none."""
    found = stage_warnings(final)
    return ["", "## Warnings", "", *(f"- **Warning:** {text}" for text in found)] if found else []


def warnings_html(final: dict[str, Any]) -> list[str]:
    """HTML blocks of a warnings section, or none."""
    found = stage_warnings(final)
    if not found:
        return []
    items = "".join(f"<li class='worse'>{escape(text)}</li>" for text in found)
    return [f"<h2>Warnings</h2><ul>{items}</ul>"]
