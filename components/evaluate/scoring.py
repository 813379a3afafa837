"""Mean reward-function score of greedy responses: the evaluate component's work (needs torch)."""

from __future__ import annotations

import json
from pathlib import Path


def mean_reward(model_dir: str, prompts_file: str, reward_function: str, max_new_tokens: int) -> float:
    import torch

    from trainer.config import GenerationOptions
    from trainer.data.tokenize import encode_prompt
    from trainer.models import load_tokenizer
    from trainer.rewards import load_reward_function
    from trainer.rollout import decode_responses, generate

    function = load_reward_function(reward_function)
    tokenizer = load_tokenizer(model_dir)
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True).eval()
    rows = [json.loads(line) for line in Path(prompts_file).read_text().splitlines() if line.strip()]
    options = GenerationOptions(max_new_tokens=max_new_tokens, temperature=0.0)
    total = 0.0
    for start in range(0, len(rows), 64):
        chunk = rows[start:start + 64]
        batch = generate(model, tokenizer, [encode_prompt(tokenizer, r["prompt"]) for r in chunk], options,
                         torch.device("cpu"))
        for row, text in zip(chunk, decode_responses(tokenizer, batch)):
            total += float(function(str(row["prompt"]), text, row.get("answer")))
    return total / max(len(rows), 1)
