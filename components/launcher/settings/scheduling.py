"""Scheduling options of a stage's pods: the platform's defaults (ConfigMap) and a run's overrides.

Two sources set the same `ClusterOptions` fields, and each error names where the bad value came from:

- the chart's defaults ConfigMap, as the component pod's environment (`ALIGNFLOW_AFFINITY`, ...):
  an error names the variable, which is the ConfigMap key;
- a pipeline's `scheduling` parameter, a JSON object such as
  `{"cpu_request": "8", "memory_limit": "64Gi", "active_deadline_seconds": 86400}`: an error names
  `scheduling.<key>`. A run's values win over the platform's.

What this leaves out: node selector, tolerations, GPU resource, priority class, Kueue queue and
service account are read by `platform.py` (they predate this module); the manifest's own checks of
the final values are in `pod/checks.py`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from components.launcher.pod.checks import quantity_value
from trainer.errors import LaunchError

# ClusterOptions field -> (ConfigMap key / environment variable, kind of value).
PLATFORM_FIELDS = {
    "affinity": ("ALIGNFLOW_AFFINITY", "object"),
    "cpu_request": ("ALIGNFLOW_CPU_REQUEST", "quantity"),
    "cpu_limit": ("ALIGNFLOW_CPU_LIMIT", "quantity"),
    "memory_request": ("ALIGNFLOW_MEMORY_REQUEST", "quantity"),
    "memory_limit": ("ALIGNFLOW_MEMORY_LIMIT", "quantity"),
    "shm_size": ("ALIGNFLOW_SHM_SIZE", "quantity"),
    "active_deadline_seconds": ("ALIGNFLOW_ACTIVE_DEADLINE_SECONDS", "seconds"),
    "pending_timeout_seconds": ("ALIGNFLOW_PENDING_TIMEOUT_SECONDS", "seconds"),
    "poll_seconds": ("ALIGNFLOW_POLL_SECONDS", "seconds"),
}
# What a run may override through its `scheduling` parameter. Service account, priority class and Kueue queue
# stay the platform's: they decide whose quota and which preemption rank a job gets, not how it runs.
OVERRIDE_KINDS = {
    **{name: kind for name, (_, kind) in PLATFORM_FIELDS.items()},
    "node_selector": "object", "tolerations": "list", "gpu_resource": "text", "timeout_seconds": "seconds",
}
EXPECTED = {"object": "a JSON object", "list": "a JSON list of objects", "text": "a string",
            "quantity": "a Kubernetes quantity such as '8', '500m' or '16Gi'",
            "seconds": "a positive number of seconds"}


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


def scheduling_from_environment(environ: Mapping[str, str]) -> dict[str, Any]:
    """The platform's scheduling defaults from the ConfigMap's variables; unset or empty ones are left out."""
    values: dict[str, Any] = {}
    for name, (variable, kind) in PLATFORM_FIELDS.items():
        text = environ.get(variable, "").strip()
        if text in ("", "null", "0") or (kind == "object" and text == "{}"):
            continue  # "0" seconds means "no deadline" in the chart's values
        values[name] = check_value(text, kind, f"{variable} (ConfigMap key)")
    return values


def scheduling_overrides(overrides: Any, parameter: str = "scheduling") -> dict[str, Any]:
    """A run's `scheduling` parameter (a dict, or its JSON text) checked; raises LaunchError naming the key."""
    if overrides in (None, "", {}):
        return {}
    if isinstance(overrides, str):
        overrides = check_value(overrides, "object", parameter)
    if not isinstance(overrides, dict):
        raise LaunchError(f"{parameter} is {overrides!r}, expected a JSON object")
    unknown = sorted(set(overrides) - set(OVERRIDE_KINDS))
    if unknown:
        raise LaunchError(f"{parameter} has unknown key(s) {', '.join(unknown)}; "
                          f"expected any of {', '.join(sorted(OVERRIDE_KINDS))}")
    return {name: check_value(value, OVERRIDE_KINDS[name], f"{parameter}.{name}")
            for name, value in overrides.items() if value is not None}
