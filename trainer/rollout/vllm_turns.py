"""Agent turns batched continuously on vLLM's engine (`environment.schedule: as_ready` with `rollout.engine: vllm`).

`VLLMEngine.generate` hands vLLM a batch and waits for its last response, so an episode whose tool answers while
that call runs waits for the whole batch to end. Here each episode's turn is a request of its own: it is added to
the engine the moment its observation is ready and joins the running batch at the engine's next step, and each
turn comes back the step it ends. That is vLLM's continuous batching, driven step by step from the scheduling
thread (`LLMEngine.add_request`/`step`/`abort_request`) on the same in-process engine and weights the trainer
syncs, rather than through `AsyncLLM`, which would need an event loop and, for weights handed over as tensors,
the same process anyway. Each turn's prompt is the episode so far, whose earlier turns vLLM's prefix cache still
holds (it is reset only when weights are pushed).

Sampling is seeded per request (`sampling_params`), so a turn's random draws depend on its seed alone, not on
which other turns share the engine's steps; the caller derives the seed from the episode's row and turn.
"""

from __future__ import annotations

import itertools
from collections.abc import Hashable
from typing import Any

from trainer.config import GenerationConfig
from trainer.rollout.vllm_sampling import sampled_logps, sampling_params

_STREAM_IDS = itertools.count()  # request ids unique in the process: "turn-<stream>-<n>"


class TurnStream:
    """Turns in flight on one vLLM engine: `submit` one, `step` the engine, `abort` what is left.

    Args:
        llm: vLLM's `LLM`, awake.
        options: The `generation` section (temperature, top-p, top-k; `max_new_tokens` is each turn's own).
        stop_token_ids: Token ids that end a turn.
        lora_request: The adapter requests name (`rollout.vllm.lora_sync: adapter`), or None.
    """

    def __init__(self, llm: Any, options: GenerationConfig, stop_token_ids: list[int], lora_request: Any) -> None:
        self.llm = llm
        self.engine = llm.llm_engine
        self.options = options
        self.stop_token_ids = stop_token_ids
        self.lora_request = lora_request
        self.prefix = f"turn-{next(_STREAM_IDS)}-"
        self.count = itertools.count()
        self.keys: dict[str, Hashable] = {}  # request id -> the caller's key, while in flight

    def __len__(self) -> int:
        """Turns in flight."""
        return len(self.keys)

    def submit(self, key: Hashable, prompt_ids: list[int], max_tokens: int, seed: int | None) -> None:
        """Add a turn: up to `max_tokens` tokens after `prompt_ids`, seeded with `seed` (ignored when greedy)."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        params: SamplingParams = sampling_params(self.options.model_copy(update={"max_new_tokens": max_tokens}),
                                                 self.stop_token_ids, 1, seed)
        params.output_kind = RequestOutputKind.FINAL_ONLY  # one output per turn, when it ends
        request_id = f"{self.prefix}{next(self.count)}"
        # Rendered as `LLM.generate` renders its prompts (vLLM deprecates handing the engine raw prompts).
        rendered = self.llm._preprocess_cmpl_one(TokensPrompt(prompt_token_ids=prompt_ids))
        self.engine.add_request(request_id, rendered, params, lora_request=self.lora_request)
        self.keys[request_id] = key

    def step(self) -> list[tuple[Hashable, list[int], list[float]]]:
        """One engine step over every turn in flight: (key, sampled ids, their log-probs) of the turns that ended."""
        ended = []
        for output in self.engine.step():
            if output.finished and output.request_id in self.keys:
                completion = output.outputs[0]
                ended.append((self.keys.pop(output.request_id), list(completion.token_ids),
                              sampled_logps(completion)))
        return ended

    def abort(self) -> None:
        """Drop the turns still in flight (episodes abandoned, or an error), freeing their KV blocks."""
        if self.keys:
            self.engine.abort_request(list(self.keys))
            self.keys.clear()
