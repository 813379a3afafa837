"""Version checks for features newer than pyproject.toml's floors (which admit ColossalAI's pins)."""

from __future__ import annotations

import pytest

from tests.conftest import make_config
from trainer.compat import PACKING_TRANSFORMERS, dtype_keyword, has_at_least, installed_version, missing_requirement


def test_missing_requirement_names_the_version_found_and_needed():
    found = installed_version("torch")

    assert missing_requirement("torch", "2.0") is None
    assert missing_requirement("torch", "999.0") == f"needs torch>=999.0; this environment has torch {found}"
    assert missing_requirement("alignflow-no-such-package", "1.0").endswith("(not installed)")


def test_local_version_suffix_does_not_hide_a_release():
    # torch reports e.g. 2.13.0+cpu: that is still 2.13.0 for the check.
    release = installed_version("torch").base_version
    assert has_at_least("torch", release)


def test_sft_packing_default_follows_the_installed_transformers(tmp_path, tiny_model, task_files):
    config = make_config("sft", tmp_path, tiny_model, task_files["sft_train"])

    assert config.sft.packing is has_at_least("transformers", PACKING_TRANSFORMERS)


@pytest.mark.skipif(not has_at_least("transformers", PACKING_TRANSFORMERS), reason="packing needs newer transformers")
def test_sft_packing_true_is_kept_where_transformers_can_pack(tmp_path, tiny_model, task_files):
    config = make_config("sft", tmp_path, tiny_model, task_files["sft_train"], sft={"packing": True})

    assert config.sft.packing is True
    assert dtype_keyword("float32") == {"dtype": "float32"}
