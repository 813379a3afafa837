"""Scoring greedy responses: the evaluate component's work (it needs torch)."""

from __future__ import annotations

import json
from pathlib import Path


def score_model(model_dir: str, prompts_file: str, reward_function: str, reward_model_dir: str | None,
                max_new_tokens: int) -> dict[str, float]:
    """Mean reward-function score (`reward`) and, with a reward model, its mean score (`rm_score`)."""
    import torch
    from transformers import AutoModelForCausalLM

    from trainer.config import GenerationOptions, ModelConfig
    from trainer.data.tokenize import encode_prompt
    from trainer.models import load_tokenizer, load_value_model
    from trainer.online.reward_sources import RewardModelScorer, load_reward_function
    from trainer.online.rollout import decode_responses, generate

    function = load_reward_function(reward_function)
    tokenizer = load_tokenizer(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True).eval()
    scorer = None
    if reward_model_dir:
        scorer = RewardModelScorer(load_value_model(ModelConfig(path=reward_model_dir)).eval())
    rows = [json.loads(line) for line in Path(prompts_file).read_text().splitlines() if line.strip()]
    options = GenerationOptions(max_new_tokens=max_new_tokens, temperature=0.0)
    reward = rm_score = 0.0
    for start in range(0, len(rows), 64):
        chunk = rows[start:start + 64]
        prompts = [str(r["prompt"]) for r in chunk]
        batch = generate(model, tokenizer, [encode_prompt(tokenizer, r["prompt"]) for r in chunk], options,
                         torch.device("cpu"))
        responses = decode_responses(tokenizer, batch)
        reward += sum(float(function(p, c, r.get("answer"))) for p, c, r in zip(prompts, responses, chunk))
        if scorer is not None:
            rm_score += float(scorer(batch, prompts, responses, [r.get("answer") for r in chunk]).sum())
    count = max(len(rows), 1)
    return {"reward": reward / count, **({"rm_score": rm_score / count} if scorer is not None else {})}
