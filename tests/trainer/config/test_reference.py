"""The config reference page is generated from the config classes and kept in step with them."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from trainer.config import COMMAND_CONFIGS, LoraConfig, Section
from trainer.config.reference import render_reference

PAGE = Path(__file__).resolve().parents[3] / "docs" / "config-reference.md"


def test_committed_page_matches_the_config_classes() -> None:
    expected = render_reference(COMMAND_CONFIGS)
    assert PAGE.read_text(encoding="utf-8") == expected, (
        "docs/config-reference.md is stale: run `python -m trainer.config.reference docs/config-reference.md`"
    )


class ToyAlgorithm(Section):
    beta: float = Field(0.1, gt=0, description="How strongly the policy is held near the reference.")
    mode: Literal["a", "b"] = Field("a", description="Which | variant.")


class ToyConfig(Section):
    output_dir: str = Field(description="Where outputs go.")
    toy: ToyAlgorithm = Field(default_factory=ToyAlgorithm, description="The toy section.")
    lora: LoraConfig | None = Field(None, description="Optional adapter.")


def test_each_field_is_one_row_with_type_bounds_default_and_description() -> None:
    page = render_reference({"toy": ToyConfig})
    assert "### `toy`: ToyConfig" in page
    assert "| `output_dir` | `str` | required | Where outputs go. |" in page
    assert "| `toy` | section [ToyAlgorithm](#toyalgorithm) | defaults | The toy section. |" in page
    assert "| `lora` | section [LoraConfig](#loraconfig) \\| None | `None` | Optional adapter. |" in page
    assert "| `beta` | `float` (> 0) | `0.1` | How strongly the policy is held near the reference. |" in page
    # A `|` inside a cell would split the table row.
    assert "| `mode` | `'a' \\| 'b'` | `'a'` | Which \\| variant. |" in page


def test_a_section_shared_by_stages_is_written_once() -> None:
    page = render_reference(COMMAND_CONFIGS)
    assert page.count("### ModelConfig\n") == 1
    assert page.count("[ModelConfig](#modelconfig)") > 1
