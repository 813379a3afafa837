"""Rollouts record which responses were truncated (no stop token within `max_new_tokens`)."""

from __future__ import annotations

import torch

from trainer.config import GenerationConfig
from trainer.rollout.engines import RolloutEngine, SampledResponses
from trainer.rollout.single_turn import generate
from trainer.tiny.model import build_tokenizer


class FixedEngine(RolloutEngine):
    """Returns the same response ids for every prompt (what a sampler might have produced)."""

    def __init__(self, responses: list[list[int]]) -> None:
        self.responses = torch.tensor(responses)

    def generate(self, prompt_ids, prompt_mask, options, *, stop_token_ids, pad_token_id):
        return SampledResponses(self.responses)

    def sync_from(self, policy) -> None:
        pass


def test_a_rollout_marks_responses_without_a_stop_token_as_truncated():
    tokenizer = build_tokenizer()
    digit, eos = tokenizer.convert_tokens_to_ids("7"), tokenizer.eos_token_id
    engine = FixedEngine([[digit, eos, digit], [digit, digit, digit]])
    batch = generate(engine, tokenizer, [[digit], [digit]], GenerationConfig(max_new_tokens=3), torch.device("cpu"))
    torch.testing.assert_close(batch["truncated"], torch.tensor([0.0, 1.0]))
    assert batch["action_mask"].sum(-1).tolist() == [2, 3]  # up to and including the stop token
