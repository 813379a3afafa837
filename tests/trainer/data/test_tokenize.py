"""Text past `max_length` is never tokenized, and cutting it first changes no token a row keeps."""

from __future__ import annotations

import random

import pytest

from trainer.data.tokenize import _ids, _leading_ids, encode_sft
from trainer.tiny.model import build_tokenizer

WORDS = ["alpha", "beta", "gamma", "delta", "  ", "\n", "the", "of", "1234", "+", "=", " ", "x", "é", "ß"]


class CountingTokenizer:
    """A tokenizer that records how many characters it was asked to tokenize."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.characters = 0
        self.eos_token = tokenizer.eos_token

    def __call__(self, text: str, **kwargs):
        self.characters += len(text)
        return self.tokenizer(text, **kwargs)


@pytest.fixture(scope="module")
def bpe_tokenizer():
    """A byte-level BPE trained here, offline, on words like `WORDS` (merges span words and spaces)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    rng = random.Random(0)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    corpus = [" ".join(rng.choice(WORDS) for _ in range(50)) for _ in range(200)]
    tokenizer.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer)


def test_the_leading_tokens_of_a_cut_text_are_those_of_the_whole_text(bpe_tokenizer):
    rng = random.Random(1)
    for _ in range(100):
        text = "".join(rng.choice(WORDS) for _ in range(rng.randint(1, 600)))
        for limit in (1, 7, 40):
            assert _leading_ids(bpe_tokenizer, text, limit) == _ids(bpe_tokenizer, text)[:limit], (text, limit)


def test_a_10_mb_completion_costs_what_max_length_tokens_cost():
    tokenizer = CountingTokenizer(build_tokenizer())
    row = {"prompt": "1+2=", "completion": "3" + "1234567890+" * 1_000_000}  # 11 MB, one character per token
    example = encode_sft(tokenizer, row, 32)
    assert example["input_ids"] == build_tokenizer()("1+2=3" + "1234567890+" * 3, add_special_tokens=False)[
        "input_ids"][:32]
    assert tokenizer.characters < 2_000  # not 11 million: only a prefix of the completion was tokenized
