"""Checking an option's value, from the platform's environment or from a run's overrides.

Two sources set the options `settings/options.py` declares, and each error names where the bad
value came from:

- the chart's defaults ConfigMap, as the component pod's environment (`ALIGNFLOW_AFFINITY`, ...):
  an error names the variable, which is the ConfigMap key;
- a pipeline's `scheduling` parameter, a JSON object such as
  `{"cpu_request": "8", "memory_limit": "64Gi", "active_deadline_seconds": 86400}`: an error names
  `scheduling.<key>`. A run's values win over the platform's. Its keys are the options a run may
  set (`set_by=RUN`); service account, priority class, Kueue queue and the rest stay the platform's
  or the component's.

What this leaves out: the manifest's own checks of the final values are in `pod/checks.py`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from components.launcher.settings.options import POD_OPTIONS, RUN, options_set_by
from components.launcher.shared.quantities import quantity_value
from trainer.errors import LaunchError

JOB_KIND_SETTINGS = ("auto", "trainjob", "pytorchjob")
EXPECTED = {"object": "a JSON object", "list": "a JSON list of objects", "text": "a string",
            "quantity": "a Kubernetes quantity such as '8', '500m' or '16Gi'",
            "seconds": "a positive number of seconds", "count": "an integer >= 1", "count0": "an integer >= 0",
            "nproc": "'auto' or an integer >= 1", "job_kind": "one of auto, trainjob, pytorchjob",
            "flag": "true or false"}


def check_job_kind(setting: str, where: str = "ALIGNFLOW_JOB_KIND (ConfigMap key)") -> str:
    """`setting` lower-cased if it is a job kind setting (`kinds/choice.py`); LaunchError naming `where` otherwise."""
    value = (setting or "auto").strip().lower()
    if value not in JOB_KIND_SETTINGS:
        raise LaunchError(f"{where} is {setting!r}, expected one of {', '.join(JOB_KIND_SETTINGS)}")
    return value


def check_value(value: Any, kind: str, where: str) -> Any:
    """`value` checked (and converted) as `kind`; raises LaunchError naming `where`."""
    if kind in ("object", "list") and isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as err:
            raise LaunchError(f"{where} is not valid JSON ({err.msg} at character {err.pos}); "
                              f"expected {EXPECTED[kind]}") from err
    if kind == "object":
        ok = isinstance(value, dict)
    elif kind == "list":
        ok = isinstance(value, list) and all(isinstance(item, dict) for item in value)
    elif kind == "text":
        ok = isinstance(value, str)
    elif kind == "quantity":
        ok = isinstance(value, (str, int, float)) and not isinstance(value, bool) and quantity_value(str(value)) is not None
        value = str(value)
    elif kind in ("count", "count0", "nproc"):
        ok, value = _check_count(value, kind)
    elif kind == "flag":
        ok, value = _check_flag(value)
    elif kind == "job_kind":
        ok, value = True, check_job_kind(str(value), where)  # raises naming `where`
    else:  # seconds
        try:
            number = float(value)
            ok = not isinstance(value, bool) and number > 0
        except (TypeError, ValueError):
            ok = False
        if ok:
            value = int(number) if number == int(number) else number
    if not ok:
        raise LaunchError(f"{where} is {value!r}, expected {EXPECTED[kind]}")
    return value


def _check_count(value: Any, kind: str) -> tuple[bool, Any]:
    if kind == "nproc" and value == "auto":
        return True, value
    try:
        number = int(value)
    except (TypeError, ValueError):
        return False, value
    ok = not isinstance(value, bool) and number == float(value) and number >= (0 if kind == "count0" else 1)
    return ok, number if ok else value


def _check_flag(value: Any) -> tuple[bool, Any]:
    if isinstance(value, bool):
        return True, value
    text = str(value).strip().lower()
    if text in ("true", "false"):
        return True, text == "true"
    return False, value


def options_from_environment(environ: Mapping[str, str]) -> dict[str, Any]:
    """Every option the platform's variables set (`PodOption.variable`), checked; unset or empty ones are left out."""
    values: dict[str, Any] = {}
    for option in POD_OPTIONS:
        text = environ.get(option.variable, "").strip() if option.variable else ""
        if text in ("", "null") or (text == "0" and option.kind == "seconds") or (option.kind == "object" and
                                                                                  text == "{}"):
            continue  # "0" seconds means "no deadline" in the chart's values
        values[option.name] = check_value(text, option.kind, f"{option.variable} (ConfigMap key)")
    return values


def scheduling_overrides(overrides: Any, parameter: str = "scheduling") -> dict[str, Any]:
    """A run's `scheduling` parameter (a dict, or its JSON text) checked; raises LaunchError naming the key."""
    if overrides in (None, "", {}):
        return {}
    if isinstance(overrides, str):
        overrides = check_value(overrides, "object", parameter)
    if not isinstance(overrides, dict):
        raise LaunchError(f"{parameter} is {overrides!r}, expected a JSON object")
    allowed = options_set_by(RUN)
    unknown = sorted(set(overrides) - set(allowed))
    if unknown:
        raise LaunchError(f"{parameter} has unknown key(s) {', '.join(unknown)}; "
                          f"expected any of {', '.join(sorted(allowed))}")
    return {name: check_value(value, allowed[name].kind, f"{parameter}.{name}")
            for name, value in overrides.items() if value is not None}
