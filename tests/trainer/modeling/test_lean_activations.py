"""The lean SwiGLU MLP and RMSNorm: Hugging Face's forward bit for bit, its gradients up to rounding, less kept."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from trainer.modeling.lean_activations import use_lean_activations
from trainer.tiny.model import build_tiny_llama

VOCAB = 40


def pair(**kwargs) -> tuple[torch.nn.Module, torch.nn.Module]:
    """Two identical tiny Llamas; the second has the lean modules."""
    hf, lean = build_tiny_llama(VOCAB, seed=1, **kwargs), build_tiny_llama(VOCAB, seed=1, **kwargs)
    assert use_lean_activations(lean) == 2 * 3 + 1  # per layer an MLP and two norms, and the final norm
    return hf, lean


def batch(seed: int = 0) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (3, 17), generator=generator)
    mask = torch.ones_like(ids)
    mask[1, :4] = 0  # one left-padded row
    return {"input_ids": ids, "attention_mask": mask}


def loss_and_grads(model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict]:
    model.zero_grad()
    logits = model(**inputs, use_cache=False).logits
    loss = F.cross_entropy(logits.flatten(0, 1), inputs["input_ids"].flatten(), reduction="none")
    loss = (loss * inputs["attention_mask"].flatten()).sum() / inputs["attention_mask"].sum()
    loss.backward()
    return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters() if p.requires_grad}


def test_forward_is_bitwise_hugging_faces_and_gradients_agree_to_rounding():
    hf, lean = pair()
    inputs = batch()
    hf_loss, hf_grads = loss_and_grads(hf, inputs)
    lean_loss, lean_grads = loss_and_grads(lean, inputs)
    assert torch.equal(lean_loss, hf_loss)
    with torch.no_grad():
        assert torch.equal(lean(**inputs).logits, hf(**inputs).logits)
    for name, grad in hf_grads.items():
        torch.testing.assert_close(lean_grads[name], grad, rtol=1e-5, atol=1e-7, msg=name)
    assert any(not torch.equal(lean_grads[n], g) for n, g in hf_grads.items())  # the lean backward did run


def test_training_steps_follow_hugging_faces():
    hf, lean = pair()
    optimizers = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (hf, lean)]
    for step in range(5):
        losses = []
        for model, optimizer in zip((hf, lean), optimizers, strict=True):
            losses.append(loss_and_grads(model, batch(step))[0])
            optimizer.step()
        torch.testing.assert_close(losses[1], losses[0], rtol=1e-5, atol=0)
    assert losses[0] < 3.5  # ln(40) = 3.69 at the start: both learned


def saved_bytes(model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> int:
    """Bytes of the distinct tensors autograd keeps for backward, parameters left out."""
    parameters = {p.untyped_storage().data_ptr() for p in model.parameters()}
    kept: dict[int, int] = {}

    def keep(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in parameters:
            kept[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(keep, lambda tensor: tensor):
        model(**inputs, use_cache=False).logits.sum()
    return sum(kept.values())


def test_it_keeps_fewer_activations():
    hf, lean = pair(hidden_size=64, num_layers=2)
    inputs = {"input_ids": torch.randint(3, VOCAB, (4, 64))}
    hf_bytes, lean_bytes = saved_bytes(hf, inputs), saved_bytes(lean, inputs)
    # Per token and layer Hugging Face keeps 4 MLP-width (128) tensors and 2 extra per RMSNorm; lean keeps 2 and 0.
    assert lean_bytes <= 0.8 * hf_bytes, (lean_bytes, hf_bytes)
    assert hf_bytes - lean_bytes >= 4 * 64 * 4 * (2 * 128 + 2 * 64) * 2  # tokens x fp32 x (MLP + norms) x layers


def test_bf16_autocast_matches_hugging_face_and_gradients_stay_fp32():
    hf, lean = pair()
    inputs = batch()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        hf_loss, hf_grads = loss_and_grads(hf, inputs)
        lean_loss, lean_grads = loss_and_grads(lean, inputs)
    assert torch.equal(lean_loss, hf_loss)
    for name, grad in hf_grads.items():
        assert lean_grads[name].dtype == torch.float32
        torch.testing.assert_close(lean_grads[name], grad, rtol=0.05, atol=2e-3, msg=name)  # bf16 rounding


def test_a_lora_wrapped_mlp_keeps_hugging_faces_forward():
    peft = pytest.importorskip("peft")
    hf, lean = pair()
    adapters = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["gate_proj", "up_proj", "down_proj"],
                               init_lora_weights=False)
    hf, lean = peft.get_peft_model(hf, adapters), peft.get_peft_model(lean, copy.deepcopy(adapters))
    lean.load_state_dict(hf.state_dict())
    inputs = batch()
    hf_loss, hf_grads = loss_and_grads(hf, inputs)
    lean_loss, lean_grads = loss_and_grads(lean, inputs)
    assert torch.equal(lean_loss, hf_loss)  # the adapters took part in the forward
    lora_grads = [name for name in hf_grads if "lora_" in name and "mlp" in name]
    assert lora_grads
    for name in lora_grads:
        torch.testing.assert_close(lean_grads[name], hf_grads[name], rtol=1e-5, atol=1e-7, msg=name)


def test_a_deep_copy_computes_with_its_own_weights():
    _, lean = pair()
    twin = copy.deepcopy(lean)
    with torch.no_grad():
        for p in twin.parameters():
            p.mul_(0.5)
    inputs = batch()
    fresh = build_tiny_llama(VOCAB, seed=1)
    fresh.load_state_dict(twin.state_dict())
    with torch.no_grad():
        assert torch.equal(twin(**inputs).logits, fresh(**inputs).logits)
        assert not torch.equal(twin(**inputs).logits, lean(**inputs).logits)


def test_loaded_models_get_it_unless_off_or_the_plugin_rewrites_modules(tiny_model):
    from trainer.config import ModelConfig
    from trainer.modeling.models import load_causal_lm
    from trainer.parallel.booster import SinglePlugin
    from trainer.runtime import DistributedEnv

    class RewritingPlugin(SinglePlugin):  # as ColossalAI's gemini and hybrid_parallel plugins say of themselves
        rewrites_modules = True

    def is_lean(model: torch.nn.Module) -> bool:
        return "forward" in model.model.layers[0].mlp.__dict__  # replaced on the instance

    plugin = RewritingPlugin(DistributedEnv(0, 0, 1), torch.device("cpu"))
    assert is_lean(load_causal_lm(ModelConfig(path=str(tiny_model))))
    assert not is_lean(load_causal_lm(ModelConfig(path=str(tiny_model), lean_activations=False)))
    assert not is_lean(load_causal_lm(ModelConfig(path=str(tiny_model)), plugin=plugin))
