"""The preference stages' sections (`trainer/config/preference.py`): DPO loss lists and their weights, and the
KTO and ORPO stages; bad combinations are one message naming the keys."""

from __future__ import annotations

import typing

import pytest

from trainer.algorithms import dpo, kto
from trainer.config import DPOAlgorithmConfig, KTOAlgorithmConfig, build_config
from trainer.errors import ConfigError


def stage(name: str, **section) -> dict:
    config = {"output_dir": "out", "model": {"path": "m"}, "data": {"train_path": "t.jsonl"}}
    return {**config, name: section} if section else config


def test_the_configs_offer_exactly_the_losses_the_objectives_implement():
    dpo_names = typing.get_args(typing.get_args(DPOAlgorithmConfig.model_fields["loss_type"].annotation)[0])
    assert dpo_names == dpo.LOSS_TYPES
    assert typing.get_args(KTOAlgorithmConfig.model_fields["loss_type"].annotation) == kto.LOSS_TYPES
    from trainer.config.preference import REFERENCE_FREE_DPO_LOSSES, SMOOTHED_DPO_LOSSES

    assert REFERENCE_FREE_DPO_LOSSES == dpo.REFERENCE_FREE_LOSSES and SMOOTHED_DPO_LOSSES == dpo.SMOOTHED_LOSSES


def test_a_dpo_loss_list_with_its_weights_is_accepted_and_loads_as_a_list():
    config = build_config("dpo", stage("dpo", loss_type=["sigmoid", "bco_pair", "sft"], loss_weights=[0.8, 0.2, 1.0]))
    assert config.dpo.loss_types == ["sigmoid", "bco_pair", "sft"]
    assert config.dpo.needs_reference


@pytest.mark.parametrize(("section", "message"), [
    ({"loss_type": ["sigmoid", "sft"], "loss_weights": [1.0]}, r"loss_weights has 1 weights but loss_type names 2"),
    ({"loss_type": "hinge", "label_smoothing": 0.1}, "label_smoothing is 0.1 but loss_type is 'hinge'"),
    ({"loss_type": "exo_pair"}, "exo_pair needs label_smoothing > 0"),
    ({"loss_type": []}, "loss_type is an empty list"),
    ({"loss_type": "dpo"}, "dpo.loss_type"),
])
def test_dpo_combinations_that_make_no_sense_are_refused(section, message):
    with pytest.raises(ConfigError, match=message):
        build_config("dpo", stage("dpo", **section))


@pytest.mark.parametrize(("section", "needs"), [({"loss_type": "simpo"}, False), ({"loss_type": ["simpo", "sft"]}, False),
                                                ({"loss_type": ["simpo", "hinge"]}, True),
                                                ({"loss_type": "sigmoid", "reference_free": True}, False)])
def test_a_reference_is_loaded_only_when_some_loss_reads_one(section, needs):
    assert build_config("dpo", stage("dpo", **section)).dpo.needs_reference is needs


def test_kto_needs_two_rows_per_micro_batch_for_its_reference_point():
    with pytest.raises(ConfigError, match="train.micro_batch_size must be at least 2"):
        build_config("kto", {**stage("kto"), "train": {"micro_batch_size": 1}})
    # apo_zero_unpaired has no reference point: one row is fine.
    build_config("kto", {**stage("kto", loss_type="apo_zero_unpaired"), "train": {"micro_batch_size": 1}})


def test_kto_and_orpo_are_stages_with_their_own_sections():
    assert build_config("kto", stage("kto", beta=0.5, undesirable_weight=1.33)).kto.undesirable_weight == 1.33
    assert build_config("orpo", stage("orpo", beta=0.25)).orpo.beta == 0.25
    with pytest.raises(ConfigError, match="orpo.ref_model_path"):  # ORPO has no reference model to name
        build_config("orpo", stage("orpo", ref_model_path="r"))
