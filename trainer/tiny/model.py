"""Build a tiny Llama causal LM and a character-level tokenizer with a chat template, offline."""

from __future__ import annotations

import string
from pathlib import Path

import torch

SPECIAL_TOKENS = ["<pad>", "<unk>", "<|end|>", "<|system|>", "<|user|>", "<|assistant|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def build_tokenizer():
    """One token per printable ASCII character, plus pad/unk/end and chat role tokens."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: index for index, token in enumerate(SPECIAL_TOKENS + list(string.printable[:95]))}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    backend.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", unk_token="<unk>",
                                        eos_token="<|end|>", additional_special_tokens=SPECIAL_TOKENS[3:])
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_tiny_llama(vocab_size: int, *, hidden_size: int = 64, num_layers: int = 2, num_heads: int = 4,
                     seed: int = 0, pad_token_id: int = 0, eos_token_id: int = 2):
    """A randomly initialised `LlamaForCausalLM` small enough to train on a CPU in seconds."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=num_heads // 2,
        max_position_embeddings=256, tie_word_embeddings=False, pad_token_id=pad_token_id,
        eos_token_id=eos_token_id, bos_token_id=None,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config)


def write_tiny_model(directory: str | Path, **model_kwargs) -> Path:
    """Save a tiny Llama and its tokenizer as an HF directory `from_pretrained` can read."""
    directory = Path(directory)
    tokenizer = build_tokenizer()
    model = build_tiny_llama(len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                             eos_token_id=tokenizer.eos_token_id, **model_kwargs)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory
