"""Loading a config: YAML by path or URI, `--set key=value` overrides, one ConfigError naming `path:line`.

Unknown keys, wrong types and missing fields fail at load time with one `ConfigError` that names
the dotted key and, when the value came from a file, `path:line`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, get_args

import yaml
from pydantic import BaseModel, ValidationError

from trainer.config.sections import Section
from trainer.config.stages import COMMAND_CONFIGS, StageConfig
from trainer.errors import ConfigError, StorageError

# ---------------------------------------------------------------------------------------------
# Loading


def _key_lines(node: yaml.Node, prefix: tuple = ()) -> dict[tuple, int]:
    """Map each dotted key path of a composed YAML document to its 1-based line."""
    lines: dict[tuple, int] = {}
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            path = prefix + (key_node.value,)
            lines[path] = key_node.start_mark.line + 1
            lines.update(_key_lines(value_node, path))
    return lines


def _read_yaml(path: str) -> tuple[dict, dict[tuple, int]]:
    """The mapping in a YAML file (a local path, `s3://` or `minio://`) and the line of each key."""
    from trainer.storage import get_storage, is_remote

    try:
        if is_remote(path):
            text = get_storage(path).read_bytes(path).decode()
        else:
            text = Path(path).read_text()
    except OSError as err:
        raise ConfigError(f"{path}: cannot read config: {err.strerror}") from err
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path}: cannot read config: not UTF-8 text ({err.reason})") from err
    except StorageError as err:
        raise ConfigError(f"cannot read config: {err}") from err
    try:
        data = yaml.safe_load(text) or {}
        root = yaml.compose(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise ConfigError(f"{where}: invalid YAML: {getattr(err, 'problem', err)}") from err
    if not isinstance(data, dict):
        raise ConfigError(f"{path}:1: expected a mapping of sections at the top, found {type(data).__name__}")
    return data, _key_lines(root) if root is not None else {}


def _apply_override(data: dict, override: str) -> tuple:
    key, sep, raw = override.partition("=")
    if not sep or not key:
        raise ConfigError(f"--set {override!r}: expected key=value, e.g. --set optimizer.lr=1e-4")
    parts = tuple(key.strip().split("."))
    target = data
    for part in parts[:-1]:
        child = target.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"--set {key}: {part} is not a section")
        target = child
    try:
        target[parts[-1]] = yaml.safe_load(raw)
    except yaml.YAMLError as err:
        raise ConfigError(f"--set {key}: cannot parse value {raw!r}") from err
    return parts


def _describe(error: dict, path: str | Path | None, lines: dict[tuple, int], overridden: set[tuple]) -> str:
    loc = tuple(str(part) for part in error["loc"])
    dotted = ".".join(loc) or "<top>"
    # Overrides that explain the error: one that set this key, a section around it, or a key inside it.
    flags = sorted(".".join(key) for key in overridden if key[:len(loc)] == loc or loc[:len(key)] == key)
    places = []
    if loc not in overridden:
        # Missing fields have no line of their own: point at the nearest enclosing key.
        line = next((lines[loc[:n]] for n in range(len(loc), 0, -1) if loc[:n] in lines), None)
        if line is not None or not flags:
            places.append(f"{path}:{line}" if path and line else str(path or "config"))
    places.extend(f"--set {flag}" for flag in flags)
    where = ", ".join(places)
    kind = error["type"]
    if kind == "extra_forbidden":
        return f"{where}: unknown key {dotted}"
    if kind == "missing":
        return f"{where}: missing required field {dotted}"
    message = error["msg"].removeprefix("Value error, ")
    return f"{where}: {dotted} is {error.get('input')!r}, expected: {message}"


def build_config(stage: str, data: dict, *, path: str | Path | None = None, lines: dict | None = None,
                 overridden: set[tuple] = frozenset()) -> StageConfig:
    """Validate a raw mapping into the stage's config class, or raise one ConfigError."""
    if stage not in COMMAND_CONFIGS:
        raise ConfigError(f"unknown stage {stage!r}, expected one of {sorted(COMMAND_CONFIGS)}")
    try:
        return COMMAND_CONFIGS[stage].model_validate(data)
    except ValidationError as err:
        problems = [_describe(e, path, lines or {}, overridden) for e in err.errors()]
        raise ConfigError("invalid config:\n  " + "\n  ".join(problems)) from None


def load_config(stage: str, path: str | Path, overrides: list[str] = ()) -> StageConfig:
    """Read a stage config from YAML, apply `key=value` overrides, validate.

    Args:
        stage: One of the stages in `STAGE_CONFIGS`.
        path: YAML file with the config sections: a local path, `s3://` or `minio://` URI.
        overrides: `dotted.key=value` strings; values are parsed as YAML scalars.

    Returns:
        The validated config of the stage.

    Raises:
        ConfigError: naming the file:line or `--set` flag and the dotted key at fault.
    """
    path = str(path)  # not Path(): that would fold `s3://b/k` into `s3:/b/k`
    data, lines = _read_yaml(path)
    overridden = {_apply_override(data, item) for item in overrides}
    return build_config(stage, data, path=path, lines=lines, overridden=overridden)


def describe_fields(model: type[BaseModel], prefix: str = "") -> list[str]:
    """One `dotted.key (type, default): description` line per field, for `--help-config`."""
    out = []
    for name, field in model.model_fields.items():
        # An optional section (`LoraConfig | None`) still documents its fields.
        candidates = [a for a in (get_args(field.annotation) or (field.annotation,)) if a is not type(None)]
        annotation = candidates[0] if len(candidates) == 1 else field.annotation
        if isinstance(annotation, type) and issubclass(annotation, Section):
            out.extend(describe_fields(annotation, f"{prefix}{name}."))
            continue
        default = "required" if field.is_required() else repr(field.get_default(call_default_factory=True))
        out.append(f"{prefix}{name} ({default}): {field.description}")
    return out


def dump_config(config: StageConfig, path: Path) -> None:
    """Write the resolved config next to the run's outputs, so a run can be repeated."""
    path.write_text(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))


def as_dict(config: StageConfig) -> dict[str, Any]:
    return config.model_dump(mode="json")
