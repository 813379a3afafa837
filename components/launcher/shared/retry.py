"""The launcher's retry policy: `trainer.http`'s (the one definition of transient, exponential backoff, a budget and a
deadline), naming the Kubernetes API and giving up with `ApiUnavailable`, a LaunchError.

What this module leaves out: what a failure means for the job. The launcher decides that (an
unreachable API server never deletes a running job); the CLI never retries creating a run.
"""

from __future__ import annotations

from trainer.errors import LaunchError
from trainer.http.retry import RetryPolicy as HttpRetryPolicy


class ApiUnavailable(LaunchError):
    """The API server kept failing for longer than the retry budget."""


class RetryPolicy(HttpRetryPolicy):
    """`trainer.http.retry.RetryPolicy` with the launcher's defaults: the Kubernetes API, `ApiUnavailable`."""

    api = "the Kubernetes API"
    unavailable = ApiUnavailable
