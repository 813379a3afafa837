"""The one interface every kind of training job implements for the launcher.

A stage's job is a `kubeflow.org/v1` PyTorchJob (the Training Operator v1: `pytorchjob/`) or a
`trainer.kubeflow.org/v1alpha1` TrainJob (Kubeflow Trainer v2, through the Kubeflow SDK:
`trainjob/`). `KubernetesLauncher` (follow/launcher.py) drives either one through `JobKind`: build the
request from a `JobSpec`, create it (or re-attach to the job of that name a retried task finds),
follow its phase, find its pods and the rank-0 one, read the trainer's log tail, delete it, and list
a run's jobs for the exit handler. Which kind a platform uses is decided in `choice.py`, which also
builds the kinds: this module imports none of them.

Phases are the launcher's own words for both kinds: Created, Running, Restarting, Suspended,
Succeeded, Failed (a TrainJob's `Complete` is Succeeded).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trainer.errors import LaunchError

if TYPE_CHECKING:
    from components.launcher.pod.spec import JobSpec
    from components.launcher.shared.retry import RetryPolicy

TERMINAL = ("Succeeded", "Failed")


class JobDeleted(LaunchError):
    """The job disappeared while the launcher was following it."""


@dataclass(frozen=True, slots=True)
class JobState:
    """What the launcher needs to know about a job at one moment."""

    phase: str | None
    """None before the controller has said anything."""
    message: str = ""
    """Why it failed, when the kind's status says so (e.g. `DeadlineExceeded: ...`)."""


class JobFollower(ABC):
    """Follows one job's phase; each `states` call lasts about `seconds` (the launcher looks at pods between)."""

    @abstractmethod
    def states(self, seconds: float) -> Iterator[JobState]:
        """Yield the job's state after each change seen within about `seconds` (at least one read).

        Raises:
            JobDeleted: The job no longer exists.
            ApiUnavailable: The API kept failing past the retry budget.
        """


class JobKind(ABC):
    """One kind of training job on Kubernetes; see the module docstring."""

    kind: str
    """The resource's kind, as messages name it (`PyTorchJob`, `TrainJob`)."""
    container: str
    """The container whose log is the trainer's (`pytorch`, `node`)."""

    @abstractmethod
    def build(self, spec: JobSpec) -> Any:
        """What `create` submits for `spec`, checked first. Raises LaunchError naming every problem."""

    @abstractmethod
    def identity(self, request: Any) -> tuple[str, str]:
        """(namespace, name) of a built request."""

    @abstractmethod
    def create(self, request: Any, retry: RetryPolicy) -> bool:
        """Create the job, or find the one of the same name (a retried task). Returns True when re-attached.

        Raises:
            LaunchError: The API refused the job (naming its answer), or stayed unavailable.
        """

    @abstractmethod
    def follower(self, namespace: str, name: str, retry: RetryPolicy) -> JobFollower:
        """A follower of the job's phase."""

    @abstractmethod
    def pod_selector(self, name: str) -> str:
        """The label selector of the job's pods."""

    @abstractmethod
    def rank_zero_pod(self, pods: list) -> str | None:
        """The started pod whose log is the trainer's (node rank 0), or None before it starts."""

    @abstractmethod
    def log_tail(self, namespace: str, name: str, lines: int) -> str:
        """The last `lines` of the rank-0 trainer's log; a note in parentheses when it cannot be read."""

    @abstractmethod
    def delete(self, namespace: str, name: str) -> None:
        """Delete the job (its pods go with it); a job already gone is fine, a failure is logged, not raised."""

    @abstractmethod
    def run_jobs(self, namespace: str, run_label: str, retry: RetryPolicy) -> list[str]:
        """Names of the jobs labelled `alignflow/run=<run_label>` (what the exit handler deletes)."""
