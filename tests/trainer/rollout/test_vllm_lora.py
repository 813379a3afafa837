"""A LoRA actor's adapter as a PEFT adapter directory (what `rollout.vllm.lora_sync: adapter` hands vLLM), and when
syncs push it. No vLLM needed: the directory is read back with PEFT's own loader; vLLM reading it is
tests/vllm/test_vllm_engine.py."""

from __future__ import annotations

import json

import pytest
import torch

from trainer.config import LoraConfig, ModelConfig, VLLMConfig
from trainer.errors import ConfigError
from trainer.modeling.models import load_causal_lm
from trainer.rollout.vllm_lora import engine_lora_options, uses_adapter, write_adapter

LORA = LoraConfig(r=4, alpha=8)


def test_the_written_adapter_loads_with_peft_and_answers_as_the_actor_does(tiny_model, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    actor = load_causal_lm(ModelConfig(path=str(tiny_model), lora=LORA)).eval()
    torch.manual_seed(0)
    with torch.no_grad():  # a trained adapter (B starts at zero, which adds nothing)
        for name, parameter in actor.named_parameters():
            if "lora_B" in name:
                parameter.normal_(std=0.5)
    directory = write_adapter(actor, LORA, tmp_path / "adapter")

    config = json.loads((directory / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], config["target_modules"]) == (4, 8.0, LORA.target_modules)
    loaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model), directory).eval()
    ids = torch.tensor([[5, 17, 30, 9, 44, 12]])
    base = AutoModelForCausalLM.from_pretrained(tiny_model).eval()
    with torch.no_grad():
        expected, got, without = actor(ids).logits, loaded(ids).logits, base(ids).logits
    assert torch.allclose(got, expected, atol=1e-5)
    assert not torch.allclose(without, expected, atol=1e-3)  # the adapter matters


def test_an_actor_without_lora_weights_writes_no_adapter(tiny_model, tmp_path):
    with pytest.raises(ValueError, match="no LoRA weights"):
        write_adapter(load_causal_lm(ModelConfig(path=str(tiny_model))), LORA, tmp_path / "adapter")
    assert not (tmp_path / "adapter").exists()


@pytest.mark.parametrize(("lora_sync", "lora", "on_cpu", "expected"), [
    ("auto", LORA, True, False),  # the CPU merges (benchmarks/lora_sync.py)
    ("auto", LORA, False, True),
    ("auto", None, False, False),
    ("adapter", LORA, True, True),
    ("merged", LORA, False, False),
    ("auto", LoraConfig(r=1024), False, False),  # above vLLM's largest rank: merged
])
def test_which_syncs_push_the_adapter(lora_sync, lora, on_cpu, expected):
    assert uses_adapter(VLLMConfig(lora_sync=lora_sync), lora, on_cpu) is expected


@pytest.mark.parametrize(("lora", "message"), [
    (None, "lora_sync is adapter but model.lora is null"),
    (LoraConfig(r=1024), "model.lora.r is 1024, above vLLM's largest LoRA rank"),
])
def test_an_adapter_sync_that_cannot_be_is_one_clear_error(lora, message):
    with pytest.raises(ConfigError, match=message):
        uses_adapter(VLLMConfig(lora_sync="adapter"), lora, on_cpu=False)


def test_the_engine_makes_room_for_the_smallest_vllm_rank_that_holds_the_adapter():
    assert engine_lora_options(LoraConfig(r=4))["max_lora_rank"] == 8
    assert engine_lora_options(LoraConfig(r=16))["max_lora_rank"] == 16
