"""Every JSON alignflow writes parses with a strict parser: non-finite numbers become null."""

from __future__ import annotations

import json
import math

import pytest

from trainer.jsonio import dumps


def strict_loads(text: str):
    def refuse(constant: str):
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_non_finite_floats_are_written_as_null_at_any_depth():
    value = {"loss": math.nan, "grad_norm": math.inf, "nested": [1.5, -math.inf, {"x": math.nan}], "step": 3}
    assert strict_loads(dumps(value)) == {"loss": None, "grad_norm": None, "nested": [1.5, None, {"x": None}], "step": 3}


def test_plain_values_are_unchanged():
    value = {"a": [1, 2.5, "s", None, True]}
    assert dumps(value, indent=2) == json.dumps(value, indent=2)


def test_python_json_would_have_written_nan():
    with pytest.raises(ValueError):
        strict_loads(json.dumps({"loss": math.nan}))
