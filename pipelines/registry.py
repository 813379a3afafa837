"""The pipelines the CLI knows, by name."""

from __future__ import annotations

from collections.abc import Callable

from trainer.errors import PipelineError


def pipelines() -> dict[str, Callable]:
    from pipelines.rlhf_dpo import rlhf_dpo

    return {"rlhf-dpo": rlhf_dpo}


def get_pipeline(name: str) -> Callable:
    known = pipelines()
    if name not in known:
        raise PipelineError(f"unknown pipeline {name!r}; expected one of {sorted(known)}")
    return known[name]
