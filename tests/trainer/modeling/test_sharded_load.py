"""Planning a sharded load: which checkpoint tensor fills each parameter, and when a model must load whole.

The sharded loads themselves (2 gloo ranks, every family) are in `tests/integration/test_model_families.py`.
"""

from __future__ import annotations

import logging

import pytest
import torch
from safetensors.torch import load_file, save_file

from trainer.config import ModelConfig
from trainer.errors import ConfigError
from trainer.modeling.models import ValueHeadModel, load_causal_lm
from trainer.modeling.sharded_load import build_on_meta, plan_reads
from trainer.parallel.booster import SinglePlugin
from trainer.runtime import DistributedEnv
from trainer.tiny.families import write_family_model


def test_a_value_model_reads_its_backbone_from_a_causal_lm_checkpoint_and_keeps_its_head(tmp_path):
    from transformers import AutoModel

    directory = write_family_model("gpt2", tmp_path)
    model = ValueHeadModel(build_on_meta(AutoModel, directory))
    reads = plan_reads(model, directory, "ppo.critic_model_path", keep=("head.",))
    assert reads["backbone.h.0.attn.c_attn.weight"] == "transformer.h.0.attn.c_attn.weight"
    assert reads.keys() == {name for name, _ in model.named_parameters() if not name.startswith("head.")}


def test_a_parameter_with_no_tensor_is_one_error_naming_it_and_the_unmatched_tensors(tmp_path):
    from transformers import AutoModelForCausalLM

    directory = write_family_model("llama", tmp_path)
    weights = load_file(directory / "model.safetensors")
    weights["model.final_norm.weight"] = weights.pop("model.norm.weight")  # a name nothing maps
    save_file(weights, directory / "model.safetensors", metadata={"format": "pt"})
    model = build_on_meta(AutoModelForCausalLM, directory)
    with pytest.raises(ConfigError, match=r"^model.path: the weights in .* have no tensor for model.norm.weight; "
                                          r"tensors in the checkpoint that match no parameter: model.final_norm.weight$"):
        plan_reads(model, directory, "model.path")


class ShardingPlugin(SinglePlugin):
    """Says it shards but never gets to: a model that cannot be read in slices loads whole before that."""

    shards_parameters = True

    def wrap_model(self, model: torch.nn.Module) -> torch.nn.Module:
        raise AssertionError("a model whose tensors are converted on load was about to be read in slices")


def test_a_checkpoint_converted_on_load_loads_whole_with_one_logged_line(tmp_path, caplog):
    from transformers import AutoConfig, AutoModelForCausalLM

    from trainer.tiny.model import build_tokenizer

    config = AutoConfig.for_model("mixtral", vocab_size=101, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                  num_attention_heads=4, num_key_value_heads=2, num_local_experts=2)
    saved = AutoModelForCausalLM.from_config(config)
    saved.save_pretrained(tmp_path)  # experts stored one by one, merged into one tensor on load
    build_tokenizer().save_pretrained(tmp_path)
    assert plan_reads(build_on_meta(AutoModelForCausalLM, tmp_path), tmp_path, "model.path") is None
    plugin = ShardingPlugin(DistributedEnv(0, 0, 1), torch.device("cpu"))
    with caplog.at_level(logging.INFO, logger="trainer.modeling.models"):
        model = load_causal_lm(ModelConfig(path=str(tmp_path)), plugin=plugin)
    assert "converts tensors on load" in caplog.text and "every rank loads it whole" in caplog.text
    for name, tensor in saved.state_dict().items():
        assert torch.equal(model.state_dict()[name], tensor), name
