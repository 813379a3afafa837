"""`Rollout`: prompt rows in, a scored rollout out, through one engine's copy of the policy.

Every path that samples and scores calls a `Rollout`: the colocated loop (`trainer.online.loop`), its
evaluation and `python -m trainer evaluate` (`trainer.online.evaluate`), and the asynchronous explorer
(`trainer.asynchronous.explorer`). A rollout owns its engine (`trainer.rollout.engines`): `collect`
samples and scores rows, `sync_weights` brings the engine up to the trained actor, `close` frees it.
One response per row is `trainer.rollout.single_turn`; an episode per row, turn by turn in an
environment, is `trainer.rollout.multi_turn`. `trainer.rollout.builder.build_rollout` builds both.

Left out: what the caller does with the result (advantages, updates, metrics, files), and which rows
it samples (`trainer.online.prompts`).
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from trainer.config import GenerationConfig, RolloutConfig
from trainer.rollout.engines import RolloutEngine
from trainer.rollout.scoring import Scorer
from trainer.tracking.timing import PhaseTimer

SAMPLES_KEPT = 5  # (prompt, response, score) triples of the latest rollout kept for reports


@dataclass(slots=True)
class ScoredRollout:
    """Sequences generated for prompt rows, their decoded responses and their scores."""

    batch: dict[str, Tensor]  # input_ids, attention_mask, action_mask, position_ids: (B, P + R); truncated (B,)
    prompts: list[str]
    responses: list[str]
    scores: Tensor  # (B,)
    engine_logps: Tensor | None = None  # (B, P + R) the engine's log-probs of the response tokens, if it gives them
    metrics: dict[str, float] = field(default_factory=dict)  # multi-turn episodes: `agent/*` (docs/agents.md)
    trajectories: list[str] | None = None  # multi-turn episodes rendered for reports; `responses` are last turns
    tool_calls: list[tuple[int, int]] | None = None  # multi-turn episodes: (tool calls, of which failed) per row
    # (B, P + R) True where `engine_logps` holds the behaviour log-probs; None: wherever it is set. Partial only for
    # episodes carried across weight versions with `hf` (`multi_turn.EpisodeCarry`): the caller computes the rest.
    engine_logps_known: Tensor | None = None
    oldest_version: int | None = None  # the oldest weight version that sampled a row (`EpisodeCarry`), else None

    def samples(self, count: int) -> list[dict]:
        """The first `count` (prompt, response, score) triples, for reports (a whole episode as its response)."""
        shown = self.trajectories if self.trajectories is not None else self.responses
        return [{"prompt": p, "response": r, "score": float(s)}
                for p, r, s in zip(self.prompts[:count], shown, self.scores.tolist())]


class Rollout(ABC):
    """Samples responses to prompt rows with `engine` and scores them with `scorer`.

    Args:
        engine: Samples the responses (and owns its copy of the weights, if it keeps one).
        tokenizer: Encodes prompts and decodes responses.
        generation: Sampling settings (the `generation` section).
        device: Where the sampled batch lives (the trainer's device).
        scorer: Scores the responses (`trainer.rollout.scoring.Scorer`).
        settings: The `rollout` section the engine was built from, `engine` chosen (never `auto`): what the
            loop's rollout correction reads.
    """

    def __init__(self, engine: RolloutEngine, *, tokenizer: Any, generation: GenerationConfig, device: torch.device,
                 scorer: Scorer, settings: RolloutConfig) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.generation = generation
        self.device = device
        self.scorer = scorer
        self.settings = settings

    @abstractmethod
    def collect(self, rows: list[dict], timer: PhaseTimer | None = None) -> ScoredRollout:
        """Sample and score one response (or episode) per row.

        Args:
            rows: Prompt rows: `prompt`, optional `answer`, `prompt_ids` where the dataset encoded the prompt.
            timer: Gets the sampling time as phase `generate` and the scoring time as `score` (multi-turn:
                the environments' time as `environment` too).

        Returns:
            The batch laid out as `trainer.rollout.single_turn.sample` lays it out, with its scores.
        """

    def with_generation(self, generation: GenerationConfig) -> Rollout:
        """This rollout sampling with other settings (greedy evaluation); it shares the engine."""
        other = copy.copy(self)
        other.generation = generation
        return other

    def sync_weights(self, policy: nn.Module) -> None:
        """Bring the engine up to `policy`'s current weights (a no-op for an engine that samples with it)."""
        self.engine.sync_from(policy)

    def close(self) -> None:
        """Free what the engine holds (a vLLM engine's memory and threads; `hf` holds nothing)."""
        self.engine.close()
