"""Greedy accuracy of a model on the addition task: the checkable reward, averaged over prompts."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from trainer.data.tokenize import encode_prompt
from trainer.tiny.task import check_answer


@torch.no_grad()
def checkable_accuracy(model_dir: str | Path, prompts_file: str | Path, max_new_tokens: int = 4) -> float:
    """Share of prompts whose greedy completion is the right sum."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    tokenizer.padding_side = "left"  # generation continues from the right end of every row
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), local_files_only=True).eval()
    rows = [json.loads(line) for line in Path(prompts_file).read_text().splitlines()]
    prompts = [encode_prompt(tokenizer, row["prompt"]) for row in rows]
    width = max(len(p) for p in prompts)
    input_ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(p)) + p for p in prompts])
    attention_mask = (torch.arange(width) >= torch.tensor([width - len(p) for p in prompts])[:, None]).long()
    output = model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=max_new_tokens,
                            do_sample=False, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    completions = tokenizer.batch_decode(output[:, width:], skip_special_tokens=False)
    rewards = [check_answer(text, row["answer"]) for text, row in zip(completions, rows)]
    return sum(rewards) / len(rewards)
