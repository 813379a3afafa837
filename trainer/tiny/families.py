"""Tiny random-initialised models of the causal LM families users train, built offline from their configs.

Each entry is a transformers `model_type` and the few settings that make it tiny (2 layers, width 32)
while keeping what sets the family apart: tied or untied embeddings, Qwen2's attention biases,
Qwen3's query/key norms, sliding windows shorter than the tests' sequences (Mistral, Phi3, Gemma3's
local layers), Gemma3's scaled embeddings and (1 + weight) norms, Phi3's fused projections, GPT-2's
learned positions and Conv1D layers, GPT-NeoX's parallel residual and its head stored as `embed_out`.
All share the project's character tokenizer (`trainer.tiny.model.build_tokenizer`), so the same data
trains every one. The family matrix (`tests/integration/test_model_families.py`) runs them through
every stage and FSDP2.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from trainer.tiny.model import build_tokenizer

SLIDING_WINDOW = 4
"""Shorter than every row of the tiny addition task, so windowed attention is exercised, not bypassed."""

_DECODER = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "max_position_embeddings": 128}

FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": ("llama", {**_DECODER, "tie_word_embeddings": False}),
    "llama-tied": ("llama", {**_DECODER, "tie_word_embeddings": True}),
    "qwen2": ("qwen2", {**_DECODER, "tie_word_embeddings": True}),
    "qwen3": ("qwen3", {**_DECODER, "head_dim": 8, "tie_word_embeddings": False}),
    "mistral": ("mistral", {**_DECODER, "sliding_window": SLIDING_WINDOW}),
    "gemma3": ("gemma3_text", {**_DECODER, "head_dim": 8, "sliding_window": SLIDING_WINDOW,
                               "layer_types": ["sliding_attention", "full_attention"]}),
    "phi3": ("phi3", {**_DECODER, "sliding_window": SLIDING_WINDOW}),
    # GPT-2's config turns dropout on (0.1) and alignflow trains with a model's dropout as configured:
    # off here, so that a DPO policy starts equal to its reference (docs/models.md, "Model families").
    "gpt2": ("gpt2", {"n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 128,
                      "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}),
    "gpt-neox": ("gpt_neox", {key: value for key, value in _DECODER.items() if key != "num_key_value_heads"}),
}
"""Family name -> (transformers `model_type`, config settings)."""


def build_family_config(family: str, vocab_size: int, *, pad_token_id: int = 0, eos_token_id: int = 2) -> Any:
    """The tiny `PretrainedConfig` of `family` (a key of `FAMILIES`)."""
    from transformers import AutoConfig

    model_type, settings = FAMILIES[family]
    return AutoConfig.for_model(model_type, vocab_size=vocab_size, pad_token_id=pad_token_id,
                                eos_token_id=eos_token_id, bos_token_id=None, **settings)


def write_family_model(family: str, directory: str | Path, seed: int = 0) -> Path:
    """Save a randomly initialised tiny `family` causal LM and the character tokenizer as an HF directory."""
    from transformers import AutoModelForCausalLM

    directory = Path(directory)
    tokenizer = build_tokenizer()
    config = build_family_config(family, len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                                 eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory
