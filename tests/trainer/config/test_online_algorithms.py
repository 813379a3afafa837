"""GRPO's section: every estimator and loss type is accepted, and combinations that make no sense are refused
with one message naming the keys (`trainer/config/online_algorithms.py`)."""

from __future__ import annotations

import typing

import pytest

from trainer.algorithms.grpo import LOSS_TYPES
from trainer.config import GRPOAlgorithmConfig, build_config
from trainer.errors import ConfigError


def grpo(**options) -> dict:
    return {"output_dir": "out", "model": {"path": "m"}, "data": {"train_path": "p.jsonl"},
            "reward": {"function": "tiny_addition"}, "grpo": options}


def test_the_config_offers_exactly_the_loss_types_the_objective_implements():
    assert typing.get_args(GRPOAlgorithmConfig.model_fields["loss_type"].annotation) == LOSS_TYPES


@pytest.mark.parametrize(("options", "message"), [
    ({"loss_type": "luspo"}, "luspo .* needs importance_sampling_level sequence"),
    ({"loss_type": "vespo", "importance_sampling_level": "sequence"}, "vespo .* needs importance_sampling_level token"),
    ({"loss_type": "cispo"}, "cispo caps the importance weight at epsilon_high, which is not set"),
    ({"advantage_estimator": "rloo", "scale_rewards": "group"}, "scale_rewards group .* advantage_estimator is 'rloo'"),
    ({"gamma": 0.9}, "gamma is 0.9 but only reinforce_plus_plus discounts"),
    ({"advantage_estimator": "rloo", "use_bias_correction_kl": True}, "use_bias_correction_kl weights the KL term"),
    ({"loss_aggregation": "token"}, r"loss_aggregation \('token'\) was replaced by loss_type: token -> dapo"),
])
def test_combinations_that_make_no_sense_are_refused_naming_the_keys(options, message):
    with pytest.raises(ConfigError, match=message):
        build_config("grpo", grpo(**options))


def test_an_overlong_buffer_must_be_shorter_than_the_longest_response():
    config = grpo(overlong_buffer_length=32)
    with pytest.raises(ConfigError, match="overlong_buffer_length is 32 but generation.max_new_tokens is 32"):
        build_config("grpo", {**config, "generation": {"max_new_tokens": 32}})
    assert build_config("grpo", {**config, "generation": {"max_new_tokens": 64}}).grpo.overlong_buffer_length == 32


@pytest.mark.parametrize(("estimator", "scale", "resolved"), [
    ("grpo", None, "group"), ("rloo", None, "none"), ("reinforce_plus_plus", None, "batch"),
    ("grpo", "none", "none"), ("rloo", "batch", "batch"),
])
def test_scale_rewards_defaults_to_the_estimators_own(estimator, scale, resolved):
    options = {"advantage_estimator": estimator, **({"scale_rewards": scale} if scale else {})}
    assert build_config("grpo", grpo(**options)).grpo.resolved_scale_rewards == resolved


@pytest.mark.parametrize(("value", "read_as"), [(True, "group"), (False, "none")])
def test_scale_rewards_true_and_false_are_read_as_trls_older_form(value, read_as):
    assert build_config("grpo", grpo(scale_rewards=value)).grpo.scale_rewards == read_as


@pytest.mark.parametrize(("estimator", "kl_in_loss"), [("grpo", True), ("rloo", False), ("reinforce_plus_plus", False)])
def test_the_estimator_places_the_kl(estimator, kl_in_loss):
    assert build_config("grpo", grpo(advantage_estimator=estimator)).grpo.kl_in_loss is kl_in_loss


def test_every_variant_the_issue_names_is_accepted():
    build_config("grpo", grpo(loss_type="dr_grpo", scale_rewards="none", dynamic_sampling=True,
                              mask_truncated_completions=True, epsilon_high=0.28))
    build_config("grpo", grpo(loss_type="grpo", importance_sampling_level="sequence"))  # GSPO
    build_config("grpo", grpo(loss_type="cispo", epsilon_high=5.0))
    build_config("grpo", grpo(advantage_estimator="reinforce_plus_plus", gamma=0.99, beta=0.01))
