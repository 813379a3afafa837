"""The pipelines the CLI knows, by name."""

from __future__ import annotations

from collections.abc import Callable

from trainer.errors import PipelineError


def pipelines() -> dict[str, Callable]:
    from pipelines.rlhf_agent import rlhf_agent
    from pipelines.rlhf_dpo import rlhf_dpo
    from pipelines.rlhf_grpo import rlhf_grpo
    from pipelines.rlhf_kto import rlhf_kto
    from pipelines.rlhf_orpo import rlhf_orpo
    from pipelines.rlhf_ppo import rlhf_ppo

    return {"rlhf-dpo": rlhf_dpo, "rlhf-ppo": rlhf_ppo, "rlhf-grpo": rlhf_grpo, "rlhf-kto": rlhf_kto,
            "rlhf-orpo": rlhf_orpo, "rlhf-agent": rlhf_agent}


def get_pipeline(name: str) -> Callable:
    known = pipelines()
    if name not in known:
        raise PipelineError(f"unknown pipeline {name!r}; expected one of {sorted(known)}")
    return known[name]
