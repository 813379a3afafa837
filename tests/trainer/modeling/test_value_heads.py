"""Reward models and critics from Hugging Face `*ForSequenceClassification` directories keep their head."""

from __future__ import annotations

import pytest
import torch

from trainer.config import ModelConfig
from trainer.errors import ConfigError
from trainer.modeling.models import load_frozen, load_value_model
from trainer.tiny.model import build_tokenizer


def sequence_classifier(tiny_model, directory, num_labels: int = 1, **save_options):
    """An offline `LlamaForSequenceClassification` on the tiny config, saved with its tokenizer."""
    from transformers import AutoConfig, LlamaForSequenceClassification

    config = AutoConfig.from_pretrained(tiny_model)
    config.num_labels = num_labels
    torch.manual_seed(3)
    model = LlamaForSequenceClassification(config).eval()
    model.save_pretrained(directory, **save_options)
    build_tokenizer().save_pretrained(directory)
    return model


IDS = torch.tensor([[7, 8, 9, 10, 11]])


@pytest.mark.parametrize("key", ["reward.model_path", "ppo.critic_model_path", "model.path"])
@pytest.mark.parametrize("shards", ["one file", "sharded"])
def test_sequence_classifier_scores_like_hugging_face(key, shards, tiny_model, tmp_path):
    options = {"max_shard_size": "40KB"} if shards == "sharded" else {}
    reference = sequence_classifier(tiny_model, tmp_path / "rm", **options)
    assert (tmp_path / "rm" / "model.safetensors.index.json").is_file() == (shards == "sharded")
    model = load_frozen(load_value_model, ModelConfig(path=str(tmp_path / "rm")), torch.device("cpu"), key=key)
    with torch.no_grad():
        ours = model(IDS)[:, -1]  # the value at the last token is the sequence's score
        theirs = reference(input_ids=IDS).logits[:, 0]
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5)
    assert torch.equal(model.head.weight, reference.score.weight)


def test_reward_model_without_a_trained_head_is_an_error(tiny_model):
    with pytest.raises(ConfigError, match=r"reward.model_path: .* has no trained value head .* LlamaForCausalLM"):
        load_value_model(ModelConfig(path=str(tiny_model)), key="reward.model_path")


def test_critic_from_a_causal_lm_starts_from_a_new_head(tiny_model):
    model = load_value_model(ModelConfig(path=str(tiny_model)), key="ppo.critic_model_path")
    assert model.head.weight.shape == (1, 64)


def test_classifier_with_more_than_one_label_is_an_error(tiny_model, tmp_path):
    sequence_classifier(tiny_model, tmp_path / "rm", num_labels=2)
    with pytest.raises(ConfigError, match=r"sequence classifier with 2 labels .* exactly 1 output"):
        load_value_model(ModelConfig(path=str(tmp_path / "rm")), key="reward.model_path")


def test_classifier_whose_head_is_missing_is_an_error(tiny_model, tmp_path):
    from safetensors.torch import load_file, save_file

    sequence_classifier(tiny_model, tmp_path / "rm")
    weights = tmp_path / "rm" / "model.safetensors"
    save_file({k: v for k, v in load_file(weights).items() if not k.startswith("score.")}, weights,
              metadata={"format": "pt"})
    with pytest.raises(ConfigError, match=r"LlamaForSequenceClassification but its weights have no classification head"):
        load_value_model(ModelConfig(path=str(tmp_path / "rm")), key="model.path")
