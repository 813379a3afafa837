"""`rollout.engine: auto` where vLLM is not installed (this environment): `hf`, chosen by the rollout builder
before anything reads the engine; an explicit engine is kept. The CPU crossover itself is tested where vLLM is installed
(tests/vllm/test_vllm_engine_choice.py)."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import stage_dict
from trainer.config import RolloutConfig, build_config
from trainer.errors import ConfigError
from trainer.modeling.models import load_causal_lm
from trainer.rollout.builder import build_rollout
from trainer.rollout.engine_choice import choose_engine
from trainer.tiny.model import build_tokenizer


@pytest.fixture
def auto_config(tiny_model):
    return build_config("grpo", stage_dict("grpo", "/tmp/unused", tiny_model, tiny_model,
                                           reward={"function": "tiny_addition"}, rollout={"engine": "auto"}))


def test_auto_without_vllm_chooses_hf_and_the_corrections_default_follows(auto_config):
    with pytest.raises(ValueError, match="not chosen yet"):
        auto_config.rollout.is_correcting  # nothing may read the engine's consequences before the choice
    rollout = build_rollout(auto_config.rollout, policy=load_causal_lm(auto_config.model), tokenizer=build_tokenizer(),
                            generation=auto_config.generation, scorer=None, device=torch.device("cpu"), rows_per_call=8)
    assert rollout.settings.engine == "hf" and not rollout.settings.is_correcting
    assert auto_config.rollout.engine == "auto"  # the loaded config is left as it was


def test_an_explicit_engine_is_kept(auto_config):
    policy = load_causal_lm(auto_config.model)
    assert choose_engine(RolloutConfig(engine="hf"), policy, 4096, torch.device("cuda")) == \
        ("hf", "set in rollout.engine")
    assert choose_engine(RolloutConfig(engine="hf"), None, 1, torch.device("cpu")) == \
        ("hf", "set in rollout.engine")  # no model is needed to keep it


def test_auto_that_might_push_an_adapter_it_does_not_have_is_refused(tiny_model):
    raw = stage_dict("grpo", "/tmp/unused", tiny_model, tiny_model, reward={"function": "tiny_addition"},
                     rollout={"engine": "auto", "vllm": {"lora_sync": "adapter"}})
    with pytest.raises(ConfigError, match="lora_sync is adapter but model.lora is null"):
        build_config("grpo", raw)
