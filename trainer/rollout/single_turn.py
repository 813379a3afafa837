"""Single-turn rollouts: one response per prompt row, sampled through a rollout engine as masked sequences.

Prompts are left-padded once, so every response starts at the same column; the engine
(`trainer.rollout.engines`, HF `generate` with its KV cache by default) samples the response tokens
(and, `vllm`, their log-probs, which come back aligned with the sequences).
The response is kept up to and including its first stop token; anything generated after it
becomes padding with mask 0. `SingleTurnRollout` decodes the responses and scores them. Multi-turn
episodes are laid out the same way (`left_pad`, `positions_from_mask`, `stop_token_ids`;
`trainer.rollout.multi_turn`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from trainer.config import GenerationConfig
from trainer.data.tokenize import encode_prompt
from trainer.rollout.engines import RolloutEngine, as_engine
from trainer.rollout.interface import Rollout, ScoredRollout
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


class SingleTurnRollout(Rollout):
    """One response per row: sampled (`sample`), decoded and scored."""

    @torch.no_grad()
    def collect(self, rows: list[dict], timer: PhaseTimer | None = None) -> ScoredRollout:
        timer = timer or PhaseTimer()
        prompt_ids = [row["prompt_ids"] if "prompt_ids" in row else encode_prompt(self.tokenizer, row["prompt"])
                      for row in rows]
        with timer.phase("generate"):
            batch, engine_logps = sample(self.engine, self.tokenizer, prompt_ids, self.generation, self.device)
        with timer.phase("score"):
            prompts = [str(row["prompt"]) for row in rows]
            responses = decode_responses(self.tokenizer, batch)
            scores = self.scorer(batch, prompts, responses, [row.get("answer") for row in rows])
        return ScoredRollout(batch, prompts, responses, scores, engine_logps)
