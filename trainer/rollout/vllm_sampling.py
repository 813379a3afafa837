"""vLLM's sampling settings and sampled log-probs, as alignflow asks for them: the one translation of the
`generation` section that the whole-batch engine (`trainer.rollout.vllm_engine`) and the turn stream
(`trainer.rollout.vllm_turns`) share."""

from __future__ import annotations

from typing import Any

from trainer.config import GenerationConfig


def sampling_params(options: GenerationConfig, stop_token_ids: list[int], count: int, seed: int | None) -> Any:
    """vLLM `SamplingParams` for `count` responses to one prompt; greedy when temperature is 0."""
    from vllm import SamplingParams

    sampling = {"temperature": 0.0} if options.temperature == 0 else {
        "temperature": options.temperature, "top_p": options.top_p, "top_k": options.top_k or 0, "seed": seed}
    return SamplingParams(n=count, max_tokens=options.max_new_tokens, stop_token_ids=stop_token_ids, logprobs=0,
                          detokenize=False, **sampling)


def sampled_logps(completion: Any) -> list[float]:
    """The log-prob of each token `completion` sampled (vLLM returns a {token: Logprob} per position)."""
    return [position[token].logprob for token, position in zip(completion.token_ids, completion.logprobs)]
