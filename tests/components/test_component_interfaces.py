"""Every training component's parameters map onto real fields of its stage config.

A parameter that names a config field (through `stage_io`'s key tables) must exist there, have
the field's type and description, and have a default the config accepts. (Defaults may differ on
purpose: DPO's learning rate is far below SFT's.)
"""

from __future__ import annotations

import typing

import pytest

from components.stage_io import COMMON_KEYS, STAGE_KEYS
from trainer.config import STAGE_CONFIGS, Section


def component_for(stage: str):
    from components.dpo.component import train_dpo
    from components.grpo.component import train_grpo
    from components.kto.component import train_kto
    from components.orpo.component import train_orpo
    from components.ppo.component import train_ppo
    from components.rm.component import train_reward_model
    from components.sft.component import train_sft

    return {"sft": train_sft, "rm": train_reward_model, "dpo": train_dpo, "kto": train_kto, "orpo": train_orpo,
            "ppo": train_ppo, "grpo": train_grpo}[stage]


def config_field(stage: str, dotted: str):
    model = STAGE_CONFIGS[stage]
    *sections, leaf = dotted.split(".")
    for section in sections:
        annotation = model.model_fields[section].annotation
        assert isinstance(annotation, type) and issubclass(annotation, Section), dotted
        model = annotation
    assert leaf in model.model_fields, f"{stage}: {dotted} is not a config field"
    return model, model.model_fields[leaf]


KFP_TYPES = {"Float": float, "Integer": int, "String": str}


@pytest.mark.parametrize("stage", sorted(STAGE_KEYS))
def test_component_parameters_match_their_config_fields(stage):
    inputs = component_for(stage).component_spec.inputs
    for parameter, dotted in {**COMMON_KEYS, **STAGE_KEYS[stage]}.items():
        section, field = config_field(stage, dotted)
        spec = inputs[parameter]
        # A Literal of strings (an enum in the config) is a string parameter in KFP; so is a Literal-or-list of them
        # (`dpo.loss_type`: one name through the parameter, a list through `settings`).
        options = typing.get_args(field.annotation) if typing.get_origin(field.annotation) is typing.Union else ()
        is_enum = typing.get_origin(field.annotation) is typing.Literal or any(
            typing.get_origin(option) is typing.Literal for option in options)
        expected = str if is_enum else field.annotation
        assert KFP_TYPES[spec.type] is expected, f"{stage}.{parameter}: {spec.type} vs {field.annotation}"
        section.__pydantic_validator__.validate_assignment(section.model_construct(), dotted.split(".")[-1],
                                                           spec.default)  # the config accepts the default
        # The same words; a docstring wraps a long one over lines, which KFP keeps as newlines.
        assert " ".join(spec.description.split()) == field.description, f"{stage}.{parameter}: {spec.description!r}"
