"""The ColossalAI image variant installs what `make test-colossalai` tests: the same pins, all extras."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).parents[2]
PIN = re.compile(r'"?(torch|transformers|colossalai)==([\w.]+)"?')


def variant_branch(dockerfile: str, variant: str) -> str:
    """The Dockerfile's install branch for `VARIANT=variant`, up to the next `elif` or `else`."""
    start = re.search(rf'(el)?if \[ "\$VARIANT" = "{variant}" \]', dockerfile).start()
    return dockerfile[start:re.compile(r"\belif\b|\belse\b").search(dockerfile, start + 2).start()]


def colossalai_branch(dockerfile: str) -> str:
    return variant_branch(dockerfile, "colossalai")


def test_image_variant_and_test_venv_install_the_same_pins():
    branch = colossalai_branch((ROOT / "images" / "trainer" / "Dockerfile").read_text())
    recipe = (ROOT / "Makefile").read_text()
    recipe = recipe[recipe.index("$(COLOSSALAI_STAMP): pyproject.toml"):recipe.index("test-colossalai:")]

    image_pins, venv_pins = dict(PIN.findall(branch)), dict(PIN.findall(recipe))

    assert image_pins == venv_pins == {"torch": "2.5.1", "transformers": "4.51.3", "colossalai": "0.5.0"}


def test_image_variant_installs_the_project_with_its_extras_and_dependencies():
    branch = colossalai_branch((ROOT / "images" / "trainer" / "Dockerfile").read_text())

    assert "--no-deps" not in branch
    extras = set(re.search(r'"\.\[([\w,]+)\]"', branch).group(1).split(","))
    assert {"colossalai", "s3", "mlflow", "lora"} <= extras
