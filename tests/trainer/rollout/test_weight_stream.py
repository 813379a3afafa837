"""The actor's weights as a checkpoint reader (vLLM's `reload_weights`) expects them: the names `save_pretrained`
writes, LoRA merged as the exported model holds it, FSDP2 shards gathered one tensor at a time. No vLLM needed."""

from __future__ import annotations

import pytest
import torch

from trainer.config import LoraConfig, ModelConfig
from trainer.modeling.checkpoint_keys import to_checkpoint_names
from trainer.modeling.models import load_causal_lm, merge_lora_state
from trainer.rollout.weight_stream import checkpoint_weights
from trainer.tiny.families import write_family_model


def test_a_plain_actor_streams_what_save_pretrained_would_write(tiny_model):
    model = load_causal_lm(ModelConfig(path=str(tiny_model)))
    streamed = dict(checkpoint_weights(model))
    expected = to_checkpoint_names(model, model.state_dict())
    assert sorted(streamed) == sorted(expected)
    assert all(torch.equal(streamed[name], expected[name]) for name in expected)


def test_gpt_neox_head_goes_out_under_its_checkpoint_name(tmp_path):
    model = load_causal_lm(ModelConfig(path=str(write_family_model("gpt-neox", tmp_path / "neox"))))
    streamed = dict(checkpoint_weights(model))
    assert "embed_out.weight" in streamed and "lm_head.weight" not in streamed  # the module calls it lm_head
    assert torch.equal(streamed["embed_out.weight"], model.lm_head.weight)


def test_lora_adapters_are_merged_as_the_exported_model_holds_them(tiny_model):
    model = load_causal_lm(ModelConfig(path=str(tiny_model), lora=LoraConfig(r=4, alpha=8)))
    with torch.no_grad():  # a trained adapter: B is zero at init, which would merge to nothing
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.normal_()
    streamed = dict(checkpoint_weights(model, lora_scale=2.0))
    exported = merge_lora_state(dict(model.state_dict()), 2.0)
    assert sorted(streamed) == sorted(exported) and not any(".lora_" in name for name in streamed)
    assert all(torch.allclose(streamed[name], exported[name], atol=1e-6) for name in exported)
    base = model.model.layers[0].self_attn.q_proj.base_layer.weight
    assert not torch.equal(streamed["model.layers.0.self_attn.q_proj.weight"], base)  # the adapter is in


def test_lora_without_a_scale_is_refused(tiny_model):
    model = load_causal_lm(ModelConfig(path=str(tiny_model), lora=LoraConfig(r=4, alpha=8)))
    with pytest.raises(ValueError, match="LoRA adapters but no LoRA scale"):
        list(checkpoint_weights(model))


def test_an_fsdp2_actor_is_gathered_tensor_by_tensor(tiny_model):
    """A one-rank gloo group: the state dict holds DTensors, each gathered (`full_tensor`) as it is yielded."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    from tests.integration.services import free_port

    model = load_causal_lm(ModelConfig(path=str(tiny_model)))
    expected = {name: tensor.clone() for name, tensor in to_checkpoint_names(model, model.state_dict()).items()}
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        for layer in model.model.layers:
            fully_shard(layer)
        fully_shard(model)
        assert any(isinstance(tensor, DTensor) for tensor in model.state_dict().values())
        streamed = list(checkpoint_weights(model))
    finally:
        dist.destroy_process_group()
    assert not any(isinstance(tensor, DTensor) for _, tensor in streamed)
    assert sorted(name for name, _ in streamed) == sorted(expected)
    assert all(torch.equal(tensor, expected[name]) for name, tensor in streamed)
