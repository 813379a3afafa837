"""The one place Kubernetes and retry options are applied to stage tasks."""

from __future__ import annotations

from kfp import dsl


def as_stage(task: dsl.PipelineTask, retries: int = 2) -> dsl.PipelineTask:
    """A training stage: never cached (it is keyed by the run), retried (a retry resumes from its checkpoint)."""
    task.set_caching_options(False)
    task.set_retry(num_retries=retries, backoff_duration="30s", backoff_factor=2.0)
    return task
