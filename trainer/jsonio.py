"""JSON that every parser accepts: what alignflow writes for people and tools to read.

Python's `json` writes `NaN` and `Infinity`, which are not JSON (`jq`, browsers, Go and the KFP
UI reject them). `dumps` writes non-finite floats as `null` instead and refuses anything else a
strict parser would; metrics files, `final_metrics.json`, checkpoint state and manifests use it.
"""

from __future__ import annotations

import json
import math
from typing import Any


def finite_or_none(value: Any) -> Any:
    """`value` with every non-finite float (nested in dicts, lists and tuples) replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite_or_none(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_or_none(item) for item in value]
    return value


def dumps(value: Any, **kwargs: Any) -> str:
    """`json.dumps` with NaN/Infinity written as null (`allow_nan=False` then guards the rest)."""
    return json.dumps(finite_or_none(value), allow_nan=False, **kwargs)
