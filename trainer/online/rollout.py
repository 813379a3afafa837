"""Sampling responses through a rollout engine and turning them into masked sequences.

Prompts are left-padded once, so every response starts at the same column; the engine
(`trainer.online.engines`, HF `generate` with its KV cache by default) samples the response tokens
(and, `vllm`, their log-probs, which come back aligned with the sequences).
The response is kept up to and including its first stop token; anything generated after it
becomes padding with mask 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from trainer.config import GenerationConfig
from trainer.data.tokenize import encode_prompt
from trainer.online.engines import RolloutEngine, as_engine
from trainer.tracking.timing import PhaseTimer


def stop_token_ids(tokenizer: Any, options: GenerationConfig) -> list[int]:
    """EOS plus the configured stop strings, each of which must be a single token."""
    from trainer.errors import ConfigError

    ids = [tokenizer.eos_token_id]
    for text in options.stop:
        encoded = tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(encoded) != 1:
            raise ConfigError(f"generation.stop: {text!r} is {len(encoded)} tokens, expected exactly 1")
        ids.append(encoded[0])
    return ids


def left_pad(prompts: list[list[int]], pad_token_id: int) -> tuple[Tensor, Tensor]:
    """(B, P) ids and attention mask of left-padded prompts."""
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad_token_id] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    return ids, mask


def positions_from_mask(attention_mask: Tensor) -> Tensor:
    """Position ids that start at 0 on each row's first real token (what `generate` uses)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


@torch.no_grad()
def sample(sampler: RolloutEngine | nn.Module, tokenizer: Any, prompts: list[list[int]], options: GenerationConfig,
           device: torch.device) -> tuple[dict[str, Tensor], Tensor | None]:
    """Sample one response per prompt with `sampler` (an engine, or a model for the default `hf` engine).

    Returns:
        The batch: input_ids, attention_mask, action_mask, position_ids, each (B, P + R), R the longest
        response, and truncated, (B,) 1.0 where the response has no stop token (it hit `max_new_tokens`);
        and the engine's log-prob of each response token aligned with input_ids ((B, P + R), position t
        scoring token t, 0 outside the action mask, as `response_logps` aligns them), or None from an
        engine that computes none.
    """
    prompt_ids, prompt_mask = left_pad(prompts, tokenizer.pad_token_id)
    prompt_ids, prompt_mask = prompt_ids.to(device), prompt_mask.to(device)
    stops = stop_token_ids(tokenizer, options)
    sampled = as_engine(sampler).generate(prompt_ids, prompt_mask, options, stop_token_ids=stops,
                                          pad_token_id=tokenizer.pad_token_id)
    response = sampled.ids.to(device)  # (B, R)
    is_stop = torch.isin(response, torch.tensor(stops, device=device))
    # Keep tokens up to and including the first stop: mask is 1 while no stop came *before* t.
    stops_before = torch.cumsum(is_stop.long(), dim=1) - is_stop.long()
    response_mask = (stops_before == 0).long()  # (B, R)
    response = response.masked_fill(response_mask == 0, tokenizer.pad_token_id)
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
    action_mask = torch.cat([torch.zeros_like(prompt_mask), response_mask], dim=1)
    batch = {"input_ids": torch.cat([prompt_ids, response], dim=1), "attention_mask": attention_mask,
             "action_mask": action_mask, "position_ids": positions_from_mask(attention_mask),
             "truncated": (~is_stop.any(dim=1)).float()}
    if sampled.logps is None:
        return batch, None
    logps = torch.cat([torch.zeros_like(prompt_mask, dtype=torch.float32), sampled.logps.to(device).float()], dim=1)
    return batch, logps * action_mask  # (B, P + R)


def generate(sampler: RolloutEngine | nn.Module, tokenizer: Any, prompts: list[list[int]], options: GenerationConfig,
             device: torch.device) -> dict[str, Tensor]:
    """`sample`'s batch alone: input_ids, attention_mask, action_mask, position_ids ((B, P + R)), truncated (B,)."""
    return sample(sampler, tokenizer, prompts, options, device)[0]


def decode_responses(tokenizer: Any, batch: dict[str, Tensor]) -> list[str]:
    """The response text of each row (special tokens dropped)."""
    texts = []
    for ids, mask in zip(batch["input_ids"], batch["action_mask"]):
        texts.append(tokenizer.decode(ids[mask.bool()].tolist(), skip_special_tokens=True))
    return texts

SAMPLES_KEPT = 5  # (prompt, response, score) triples of the latest rollout kept for reports


@dataclass(slots=True)
class ScoredRollout:
    """Sequences generated for prompt rows, their decoded responses and their scores."""

    batch: dict[str, Tensor]  # input_ids, attention_mask, action_mask, position_ids: (B, P + R); truncated (B,)
    prompts: list[str]
    responses: list[str]
    scores: Tensor  # (B,)
    engine_logps: Tensor | None = None  # (B, P + R) the engine's log-probs of the response tokens, if it gives them
    metrics: dict[str, float] = field(default_factory=dict)  # multi-turn episodes: `agent/*` (trainer.agents)
    trajectories: list[str] | None = None  # multi-turn episodes rendered for reports; `responses` are last turns
    tool_calls: list[tuple[int, int]] | None = None  # multi-turn episodes: (tool calls, of which failed) per row

    def samples(self, count: int) -> list[dict]:
        """The first `count` (prompt, response, score) triples, for reports (a whole episode as its response)."""
        shown = self.trajectories if self.trajectories is not None else self.responses
        return [{"prompt": p, "response": r, "score": float(s)}
                for p, r, s in zip(self.prompts[:count], shown, self.scores.tolist())]


@torch.no_grad()
def generate_and_score(sampler: RolloutEngine | nn.Module, tokenizer: Any, rows: list[dict],
                       options: GenerationConfig, device: torch.device, scorer: Any,
                       timer: PhaseTimer | None = None) -> ScoredRollout:
    """Generate one response per row (`prompt`, optional `answer`, `prompt_ids` where the dataset encoded it),
    decode it and score it.

    Every path that samples and scores (the PPO/GRPO rollout, evaluation, the explorer) calls this,
    with its rollout engine (or a model, sampled by the default `hf` engine). `timer`, where given, gets the
    sampling time as phase `generate` and the decoding and scoring time as `score`.
    """
    timer = timer or PhaseTimer()
    prompt_ids = [row["prompt_ids"] if "prompt_ids" in row else encode_prompt(tokenizer, row["prompt"]) for row in rows]
    with timer.phase("generate"):
        batch, engine_logps = sample(sampler, tokenizer, prompt_ids, options, device)
    with timer.phase("score"):
        prompts = [str(row["prompt"]) for row in rows]
        responses = decode_responses(tokenizer, batch)
        scores = scorer(batch, prompts, responses, [row.get("answer") for row in rows])
    return ScoredRollout(batch, prompts, responses, scores, engine_logps)
