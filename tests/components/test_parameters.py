"""A parameter that several components share is described once (components/parameters.py), and every component
input still reaches the IR with a description, while the source KFP embeds stays the plain function."""

from __future__ import annotations

import pytest

from components.parameters import SHARED, write_args
from tests.components.test_component_interfaces import component_for


def job_components():
    from components.evaluate.component import evaluate_model

    return [component_for(stage) for stage in ("sft", "rm", "dpo", "kto", "orpo", "ppo", "grpo")] + [evaluate_model]


@pytest.mark.parametrize("component", job_components(), ids=lambda component: component.name)
def test_every_input_is_described_and_the_embedded_source_is_the_plain_function(component):
    inputs = component.component_spec.inputs
    assert [name for name, spec in inputs.items() if not spec.description] == []
    for name in ("launcher_mode", "num_nodes", "gpus_per_node", "s3_secret", "trainer_image", "scheduling"):
        assert inputs[name].description == SHARED[name]  # the same words in every component
    source = component.component_spec.implementation.container.command[-1]
    assert f"def {component.python_func.__name__}(" in source
    assert "@documented" not in source and "import documented" not in source  # the pod never imports the table


def test_own_entries_stay_as_written_and_the_others_are_filled_in_signature_order():
    def component(model, num_nodes: int = 1, job_root: str = "", extra: str = ""):
        """Summary.

        Args:
            job_root: Where this one writes,
                over two lines.
            model: The model.

        Returns:
            Nothing.
        """

    write_args(component, {"num_nodes": "Nodes   (pods).", "job_root": "The shared words."}.get)
    assert component.__doc__ == ("Summary.\n\nArgs:\n    model: The model.\n    num_nodes: Nodes (pods).\n"
                                 "    job_root: Where this one writes,\n        over two lines.\n\nReturns:\n"
                                 "    Nothing.\n")


def test_a_docstring_that_describes_no_parameter_or_has_no_summary_is_refused():
    def stale(model):
        """Summary.

        Args:
            modle: A typo.
        """

    with pytest.raises(ValueError, match=r"stale: its docstring describes \['modle'\]"):
        write_args(stale, lambda name: None)

    def bare(model):
        pass

    with pytest.raises(ValueError, match="needs a summary line"):
        write_args(bare, lambda name: None)
