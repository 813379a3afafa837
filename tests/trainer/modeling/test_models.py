"""Tests of `trainer.modeling.models`: LoRA training and merged export, gradient checkpointing, the value model.

Everything runs on the session's tiny Llama (`tests/conftest.py`), on CPU, in a few seconds.
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModel, AutoModelForCausalLM

from tests.conftest import stage_dict
from trainer.algorithms.sft import SFTObjective
from trainer.config import LoraConfig, ModelConfig, build_config
from trainer.data.collate import pack_sft
from trainer.data.dataset import load_sft_dataset
from trainer.errors import ConfigError
from trainer.modeling.models import (
    VALUE_HEAD_FILE,
    VALUE_HEAD_MARKER,
    export_model,
    load_causal_lm,
    load_tokenizer,
    load_value_model,
)
from trainer.supervised.stages import run_stage

# A few in-vocabulary ids (the tiny vocabulary has 101 tokens): two rows of five.
TOKEN_IDS = torch.tensor([[10, 25, 40, 60, 7], [3, 99, 50, 12, 12]])  # (2, 5)


def load_reference_lm(path) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True, dtype=torch.float32).eval()


@torch.no_grad()
def logits_of(model: torch.nn.Module, input_ids: torch.Tensor = TOKEN_IDS) -> torch.Tensor:
    device = next(model.parameters()).device
    return model.eval()(input_ids=input_ids.to(device), use_cache=False).logits.cpu()  # (B, T, V)


# -- LoRA -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory, tiny_model, task_files):
    """One short SFT epoch with a rank-4 adapter; returns (output_dir, StageResult)."""
    output = tmp_path_factory.mktemp("lora")
    # `make_config(..., model=...)` collides with stage_dict's positional `model` argument, so the
    # LoRA section is set on the mapping directly.
    raw = stage_dict("sft", output, tiny_model, task_files["sft_train"], train={"max_epochs": 1})
    raw["model"]["lora"] = {"r": 4, "alpha": 8}
    return output, run_stage(build_config("sft", raw))


def test_lora_trains_only_adapters_and_keeps_base_weights(lora_run, tiny_model):
    _, result = lora_run
    parameters = dict(result.model.named_parameters())
    adapters = {name for name in parameters if ".lora_" in name}
    assert adapters, "no LoRA parameters were injected"
    assert {name for name, p in parameters.items() if p.requires_grad} == adapters
    # The adapters did train: lora_B starts at zero.
    assert any(parameters[name].abs().sum() > 0 for name in adapters if ".lora_B." in name)

    original = load_reference_lm(tiny_model).state_dict()
    base = {name.replace(".base_layer.", "."): value for name, value in result.model.state_dict().items()
            if ".lora_" not in name}
    assert base.keys() == original.keys()
    for name, value in original.items():
        assert torch.equal(base[name].cpu(), value), f"{name} changed although it was frozen"


def test_lora_export_is_merged_and_faithful(lora_run, tiny_model):
    output, result = lora_run
    exported = load_reference_lm(output / "model")
    assert not any(".lora_" in name or ".base_layer." in name for name in exported.state_dict())

    trained = logits_of(result.model)  # the in-memory model with injected adapters
    torch.testing.assert_close(logits_of(exported), trained, atol=1e-5, rtol=0)
    untrained = logits_of(load_reference_lm(tiny_model))
    assert (trained - untrained).abs().max() > 1e-3, "the adapters did not change the model"


def test_lora_target_modules_matching_nothing_is_a_config_error(tiny_model):
    config = ModelConfig(path=str(tiny_model), lora=LoraConfig(r=4, target_modules=["no_such_proj"]))
    with pytest.raises(ConfigError, match="target_modules"):
        load_causal_lm(config)


# -- gradient checkpointing -----------------------------------------------------------------------


def loss_and_gradients(model: torch.nn.Module, batch: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.train()  # checkpointing only engages in training mode
    output = SFTObjective()(model, batch)
    loss = output.total / output.count
    loss.backward()
    return loss.detach(), {name: p.grad for name, p in model.named_parameters() if p.grad is not None}


def count_mlp_calls(model: torch.nn.Module) -> list[int]:
    """Count entries into the first layer's MLP: a checkpointed layer is entered again in backward.

    A pre-hook, because the recompute stops as soon as the last saved tensor is rebuilt, before a
    post-forward hook of the MLP would run.
    """
    calls = []
    model.model.layers[0].mlp.register_forward_pre_hook(lambda *_: calls.append(1))
    return calls


def test_gradient_checkpointing_gives_same_loss_and_gradients(tiny_model, task_files):
    tokenizer = load_tokenizer(str(tiny_model))
    examples = load_sft_dataset(str(task_files["sft_train"]), tokenizer, 32, False).examples[:8]
    batch = pack_sft(examples)  # one row, (1, N)

    plain = load_causal_lm(ModelConfig(path=str(tiny_model)))
    checkpointed = load_causal_lm(ModelConfig(path=str(tiny_model), gradient_checkpointing=True))
    plain_calls, checkpointed_calls = count_mlp_calls(plain), count_mlp_calls(checkpointed)

    plain_loss, plain_grads = loss_and_gradients(plain, batch)
    checkpointed_loss, checkpointed_grads = loss_and_gradients(checkpointed, batch)

    assert (len(plain_calls), len(checkpointed_calls)) == (1, 2)  # recomputed in backward
    torch.testing.assert_close(checkpointed_loss, plain_loss, atol=1e-6, rtol=0)
    assert checkpointed_grads.keys() == plain_grads.keys() and plain_grads
    for name, grad in plain_grads.items():
        torch.testing.assert_close(checkpointed_grads[name], grad, atol=1e-6, rtol=0,
                                   msg=lambda m, name=name: f"{name}: {m}")


# -- value model ----------------------------------------------------------------------------------


def test_value_model_export_round_trip(tmp_path, tiny_model):
    model = load_value_model(ModelConfig(path=str(tiny_model))).eval()
    with torch.no_grad():
        values = model(TOKEN_IDS)
    assert values.shape == TOKEN_IDS.shape  # (B, T)

    directory = tmp_path / "value"
    export_model(model, model.state_dict(), load_tokenizer(str(tiny_model)), directory)
    assert (directory / VALUE_HEAD_FILE).is_file() and (directory / VALUE_HEAD_MARKER).is_file()
    # Every exported file (safetensors writes its own 0600) has the mode a plain file gets, so the next pod,
    # which may run as another user, can read the model.
    (tmp_path / "plain").write_text("")
    plain_mode = (tmp_path / "plain").stat().st_mode & 0o777
    assert {path.name: path.stat().st_mode & 0o777 for path in directory.iterdir()} == {
        path.name: plain_mode for path in directory.iterdir()}

    reloaded = load_value_model(ModelConfig(path=str(directory))).eval()
    fresh = load_value_model(ModelConfig(path=str(tiny_model))).eval()  # a newly initialised head
    with torch.no_grad():
        torch.testing.assert_close(reloaded(TOKEN_IDS), values, atol=0, rtol=0)
        assert not torch.allclose(fresh(TOKEN_IDS), values)  # so the head really was restored

    backbone, info = AutoModel.from_pretrained(str(directory), local_files_only=True, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert type(backbone) is type(model.backbone)


# -- bad paths ------------------------------------------------------------------------------------


@pytest.mark.parametrize("load", [
    lambda path: load_causal_lm(ModelConfig(path=path)),
    lambda path: load_value_model(ModelConfig(path=path)),
    load_tokenizer,
], ids=["causal_lm", "value_model", "tokenizer"])
def test_model_path_without_config_json_is_a_config_error(load, tmp_path):
    (tmp_path / "weights.safetensors").write_bytes(b"")  # a directory, but not an HF model
    with pytest.raises(ConfigError, match=r"model\.path"):
        load(str(tmp_path))
