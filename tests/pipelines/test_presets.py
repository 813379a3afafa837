"""Presets: every parameter they set reaches its pipeline, and the reward-hacking variant is `tiny` but for its
two documented knobs (the runs themselves are in test_pipelines.py and `make demo`)."""

from __future__ import annotations

import pytest

from pipelines.catalog import get_pipeline
from pipelines.presets import PRESETS, TINY, preset_arguments
from trainer.errors import PipelineError

CASES = [(preset, pipeline) for preset, pipelines in PRESETS.items() for pipeline in pipelines]


@pytest.mark.parametrize(("preset", "pipeline"), CASES)
def test_every_preset_parameter_is_an_input_of_its_pipeline(preset, pipeline, tmp_path):
    # preset_arguments keeps only what the pipeline accepts, so a misspelt name would be dropped silently.
    accepted = set(get_pipeline(pipeline).component_spec.inputs)
    assert set(PRESETS[preset][pipeline]) <= accepted
    arguments = preset_arguments(preset, pipeline, tmp_path, accepted)
    assert arguments["base_model_uri"].startswith(str(tmp_path.resolve()))
    assert {name: arguments[name] for name in PRESETS[preset][pipeline]} == PRESETS[preset][pipeline]


def test_reward_hacking_variant_is_tiny_without_the_kl_penalty_and_a_higher_learning_rate():
    variant, tiny = PRESETS["tiny-reward-hacking"]["rlhf-ppo"], TINY["rlhf-ppo"]
    changed = {name for name in tiny if variant[name] != tiny[name]}
    assert set(variant) == set(tiny) and changed == {"ppo_kl_coef", "ppo_lr"}
    assert variant["ppo_kl_coef"] == 0 and variant["ppo_lr"] > tiny["ppo_lr"]


def test_a_preset_refuses_a_pipeline_it_has_no_parameters_for(tmp_path):
    with pytest.raises(PipelineError, match=r"'tiny-reward-hacking' has no parameters for 'rlhf-dpo'.*rlhf-ppo"):
        preset_arguments("tiny-reward-hacking", "rlhf-dpo", tmp_path, {"base_model_uri"})
    assert not (tmp_path / "tiny-inputs").exists()  # refused before anything is written
