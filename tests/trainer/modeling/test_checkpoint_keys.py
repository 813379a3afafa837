"""Checkpoint keys are matched to a model's names as `from_pretrained` matches them, and back as `save_pretrained`."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from trainer.modeling import checkpoint_keys
from trainer.modeling.checkpoint_keys import map_checkpoint_keys, to_checkpoint_names
from trainer.modeling.sharded_load import build_on_meta
from trainer.tiny.families import write_family_model

VOCAB = 101


def saved_keys(directory) -> list[str]:
    with safe_open(str(directory / "model.safetensors"), framework="pt") as weights:
        return list(weights.keys())


def test_gpt_neox_checkpoints_store_the_head_as_embed_out_which_is_the_modules_lm_head(tmp_path):
    from transformers import AutoModelForCausalLM

    directory = write_family_model("gpt-neox", tmp_path)
    assert "embed_out.weight" in saved_keys(directory) and "lm_head.weight" not in saved_keys(directory)
    model = build_on_meta(AutoModelForCausalLM, directory)
    keys = map_checkpoint_keys(model, saved_keys(directory))
    assert keys.sources["lm_head.weight"] == "embed_out.weight"
    assert keys.unmatched == [] and keys.converted == []
    # And back, as save_pretrained writes it (what a rollout engine reading checkpoints expects).
    loaded = AutoModelForCausalLM.from_pretrained(directory)
    written = to_checkpoint_names(loaded, loaded.state_dict())
    assert written.keys() == set(saved_keys(directory))
    assert torch.equal(written["embed_out.weight"], load_file(directory / "model.safetensors")["embed_out.weight"])


@pytest.mark.parametrize("family, prefix", [("gpt2", "transformer"), ("gpt-neox", "gpt_neox"), ("llama", "model")])
def test_a_base_model_reads_a_causal_lm_checkpoint_without_its_prefix(family, prefix, tmp_path, monkeypatch):
    from transformers import AutoModel

    directory = write_family_model(family, tmp_path)
    backbone = build_on_meta(AutoModel, directory)
    parameters = [name for name, _ in backbone.named_parameters()]
    for conversions in ("transformers' own", "none (transformers 4.x)"):
        if conversions.startswith("none"):
            monkeypatch.setattr(checkpoint_keys, "_conversions", lambda model: None)
        keys = map_checkpoint_keys(backbone, saved_keys(directory))
        assert keys.missing(parameters) == [], conversions
        assert all(keys.sources[name] == f"{prefix}.{name}" for name in parameters), conversions
        assert all(not key.startswith(f"{prefix}.") for key in keys.unmatched)  # only the head is left over


def test_a_tied_head_stored_only_under_its_head_name_fills_the_embedding_as_from_pretrained_does(tmp_path):
    from transformers import AutoModelForCausalLM

    directory = write_family_model("llama-tied", tmp_path)
    weights = load_file(directory / "model.safetensors")
    weights["lm_head.weight"] = weights.pop("model.embed_tokens.weight")
    save_file(weights, directory / "model.safetensors", metadata={"format": "pt"})
    keys = map_checkpoint_keys(build_on_meta(AutoModelForCausalLM, directory), weights)
    assert keys.sources["model.embed_tokens.weight"] == keys.sources["lm_head.weight"] == "lm_head.weight"
    loaded = AutoModelForCausalLM.from_pretrained(directory)
    assert torch.equal(loaded.model.embed_tokens.weight, weights["lm_head.weight"])


def test_tensors_converted_on_load_are_reported_not_renamed(tmp_path):
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model("mixtral", vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                  num_attention_heads=4, num_key_value_heads=2, num_local_experts=2)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path)  # experts saved one by one
    keys = map_checkpoint_keys(build_on_meta(AutoModelForCausalLM, tmp_path), saved_keys(tmp_path))
    assert sorted(keys.converted) == [f"model.layers.0.block_sparse_moe.experts.{e}.w{w}.weight"
                                      for e in range(2) for w in (1, 2, 3)]
    assert "model.layers.0.mlp.experts.gate_up_proj" not in keys.sources


def test_the_mismatch_names_what_is_missing_and_what_is_left_over():
    text = checkpoint_keys.describe_mismatch(["a", "b"], [f"x{i}" for i in range(7)], limit=5)
    assert text == "have no tensor for a, b; tensors in the checkpoint that match no parameter: x0, x1, x2, x3, x4 and 2 more"
    assert checkpoint_keys.describe_mismatch(["a"], []) == "have no tensor for a"

