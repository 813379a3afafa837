"""Render the config reference (`docs/config-reference.md`) from the config classes themselves.

`python -m trainer.config.reference` prints the page; `python -m trainer.config.reference PATH` writes
it. Each stage lists its top-level fields and the sections it takes; each section class is one table
(key, type and bounds, default, description), written once however many stages share it. The
descriptions are the fields' own (`Field(description=...)`), so the page cannot say other than
`--help-config`; a test fails when the committed page is stale. Cross-field rules (a key that
needs another) live in the validators and are not rendered.
"""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from trainer.config.sections import Section

HEADER = """# Config reference

Generated from the config classes in [`trainer/config/`](../trainer/config/) by
`python -m trainer.config.reference docs/config-reference.md`; do not edit by hand
(`tests/trainer/config/test_reference.py` fails when this page is stale). The same descriptions are
printed by `python -m trainer <stage> --help-config`. How the stages use these fields:
[stages.md](stages.md), [online.md](online.md).
"""

BOUNDS = (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<="))


def section_class(annotation: Any) -> type[Section] | None:
    """The section class a field holds, also when it is optional (`LoraConfig | None`)."""
    candidates = [arg for arg in (get_args(annotation) or (annotation,)) if arg is not type(None)]
    if len(candidates) == 1 and isinstance(candidates[0], type) and issubclass(candidates[0], Section):
        return candidates[0]
    return None


def type_name(annotation: Any) -> str:
    """A short, readable spelling of a field's type: `int`, `str | None`, `'cosine' | 'linear'`."""
    origin = get_origin(annotation)
    if origin is Literal:
        return " | ".join(repr(arg) for arg in get_args(annotation))
    if origin in (Union, types.UnionType):
        return " | ".join(type_name(arg) for arg in get_args(annotation))
    if origin is not None:
        return f"{getattr(origin, '__name__', str(origin))}[{', '.join(type_name(a) for a in get_args(annotation))}]"
    if annotation is type(None):
        return "None"
    if isinstance(annotation, type):
        return annotation.__name__
    return re.sub(r"\b[\w.]+\.(\w+)", r"\1", str(annotation))


def bounds(field: FieldInfo) -> str:
    """The numeric bounds pydantic enforces on a field, e.g. `> 0, <= 1`."""
    found = []
    for constraint in field.metadata:
        for attribute, symbol in BOUNDS:
            value = getattr(constraint, attribute, None)
            if value is not None:
                found.append(f"{symbol} {value}")
    return ", ".join(found)


def anchor(model: type[BaseModel]) -> str:
    return model.__name__.lower()


def cell(text: str) -> str:
    """Text made safe for one Markdown table cell."""
    return text.replace("|", "\\|").replace("\n", " ")


def summary(model: type[BaseModel]) -> str:
    """The first paragraph of a section class's own docstring (not the base class's), on one line."""
    doc = model.__dict__.get("__doc__") or ""
    return " ".join(doc.strip().split("\n\n")[0].split())


def default_text(field: FieldInfo) -> str:
    if field.is_required():
        return "required"
    return f"`{field.get_default(call_default_factory=True)!r}`"


def field_row(name: str, field: FieldInfo) -> str:
    """One table row: a plain field, or a nested section linking to its own table."""
    nested = section_class(field.annotation)
    if nested is not None:
        kind = f"section [{nested.__name__}](#{anchor(nested)})"
        if type(None) in get_args(field.annotation):
            kind += " \\| None"
        default = "required" if field.is_required() else ("`None`" if field.get_default() is None else "defaults")
        return f"| `{name}` | {kind} | {default} | {cell(field.description or summary(nested))} |"
    kind = f"`{type_name(field.annotation)}`"
    limits = bounds(field)
    if limits:
        kind += f" ({limits})"
    return f"| `{name}` | {cell(kind)} | {cell(default_text(field))} | {cell(field.description or '')} |"


def table(model: type[BaseModel]) -> list[str]:
    rows = ["| key | type | default | description |", "|---|---|---|---|"]
    return rows + [field_row(name, field) for name, field in model.model_fields.items()]


def sections_of(model: type[BaseModel], found: dict[str, type[Section]]) -> None:
    """Every section class reachable from `model`, depth first, in declaration order."""
    for field in model.model_fields.values():
        nested = section_class(field.annotation)
        if nested is not None and nested.__name__ not in found:
            found[nested.__name__] = nested
            sections_of(nested, found)


def render_reference(configs: dict[str, type[BaseModel]]) -> str:
    """The whole page for `configs`, a mapping of command name to its config class."""
    lines = [HEADER, "## Stages", ""]
    for command, model in configs.items():
        lines += [f"### `{command}`: {model.__name__}", ""]
        lines += table(model)
        lines.append("")
    found: dict[str, type[Section]] = {}
    for model in configs.values():
        sections_of(model, found)
    lines += ["## Sections", ""]
    for model in found.values():
        lines += [f"### {model.__name__}", ""]
        if summary(model):
            lines += [summary(model), ""]
        lines += table(model)
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    from trainer.config.stages import COMMAND_CONFIGS

    args = sys.argv[1:] if argv is None else argv
    page = render_reference(COMMAND_CONFIGS)
    if args:
        Path(args[0]).write_text(page, encoding="utf-8")
    else:
        sys.stdout.write(page)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
