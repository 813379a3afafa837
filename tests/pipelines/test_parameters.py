"""The parameters every pipeline takes are declared once (`COMMON`) and join each pipeline's own, as KFP reads and
calls a pipeline function: by its signature, one positional argument a parameter."""

from __future__ import annotations

import inspect

import pytest

from pipelines.catalog import pipelines
from pipelines.parameters import COMMON, with_common_parameters


def test_common_parameters_follow_a_pipelines_own_and_reach_it_as_run():
    seen = {}

    def pipeline(base_model_uri: str, dpo_beta: float = 0.1, *, run: dict):
        seen.update(own=(base_model_uri, dpo_beta), run=run)

    parameters = inspect.signature(with_common_parameters(pipeline)).parameters
    assert list(parameters) == ["base_model_uri", "dpo_beta", *COMMON]  # `run` is no pipeline parameter
    assert parameters["sft_lr"].default == 2e-5 and parameters["sft_lr"].annotation is float
    assert parameters["scheduling"].annotation is dict
    with_common_parameters(pipeline)(*(f"channel-{name}" for name in parameters))
    assert seen["own"] == ("channel-base_model_uri", "channel-dpo_beta")
    assert seen["run"] == {name: f"channel-{name}" for name in parameters}


@pytest.mark.parametrize("name", sorted(pipelines()))
def test_every_pipeline_takes_the_common_parameters_with_their_defaults(name):
    inputs = pipelines()[name].component_spec.inputs
    assert {parameter: inputs[parameter].default for parameter in COMMON} == COMMON
    assert all(inputs[parameter].description for parameter in inputs)
