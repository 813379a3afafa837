"""Small HTML helpers: a page, an escaped table, a figure embedded as a PNG (the KFP UI renders an
HTML artifact in a sandboxed frame, so everything is inline: no scripts, no external files)."""

from __future__ import annotations

import base64
import html
import io
from typing import Any

STYLE = """body{font-family:system-ui,sans-serif;margin:1rem;color:#222}table{border-collapse:collapse;margin:.5rem 0}
td,th{border:1px solid #ccc;padding:.25rem .5rem;text-align:left;vertical-align:top;max-width:40rem}
th{background:#f3f3f3}.better{color:#17702b;font-weight:600}.worse{color:#a1261b;font-weight:600}
.note{color:#666}img{max-width:100%}"""


def escape(value: Any) -> str:
    return html.escape(str(value), quote=True)


def page(title: str, body: list[str]) -> str:
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{escape(title)}</title>"
            f"<style>{STYLE}</style></head><body><h1>{escape(title)}</h1>\n" + "\n".join(body) + "\n</body></html>\n")


def table(header: list[str], rows: list[list[str]]) -> str:
    """Rows are already-escaped HTML cells (so cells may carry markup); the header is escaped here."""
    head = "".join(f"<th>{escape(cell)}</th>" for cell in header)
    body = "".join("<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def link(url: str, text: str) -> str:
    return f"<a href='{escape(url)}' target='_blank' rel='noopener'>{escape(text)}</a>" if url else escape(text)


def figure_png(figure: Any) -> str:
    """An <img> holding the matplotlib figure as an inline PNG."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
    encoded = base64.b64encode(buffer.getvalue()).decode()
    return f"<img alt='curves' src='data:image/png;base64,{encoded}'>"


def number(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, (int, float)) else escape(value if value is not None else "-")
