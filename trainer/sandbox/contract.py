"""What a sandbox run takes and gives: its limits, its result, and its errors.

Kept free of any mechanism so the local sandbox, the remote client and the server share one vocabulary.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from trainer.config.sandbox import SandboxLimits  # noqa: F401 (part of the contract; a config section)
from trainer.errors import AlignflowError


@dataclass(frozen=True, slots=True)
class SandboxResult:
    """What a run of untrusted code produced."""

    stdout: str
    """Standard output, decoded as UTF-8 (invalid bytes replaced), cut at `max_output_bytes`."""
    stderr: str
    """Standard error, likewise; it shares the `max_output_bytes` budget with stdout."""
    exit_code: int | None
    """The program's exit status (negative: killed by that signal, e.g. -24 for SIGXCPU); None when the
    sandbox stopped it (timed out, truncated, memory or scratch exceeded)."""
    timed_out: bool
    """The wall-clock limit passed and the process tree was killed."""
    truncated: bool
    """The output outgrew `max_output_bytes`: it was cut and the process tree was killed."""
    memory_exceeded: bool = False
    """The run's processes together held more than `memory_bytes` (their files in the scratch folder included,
    where it is a tmpfs), and the process tree was killed."""
    scratch_exceeded: bool = False
    """The run's files took more than `max_scratch_bytes`, and the process tree was killed."""

    def to_dict(self) -> dict:
        """The result as JSON-ready data (the remote service's response body)."""
        return asdict(self)


class SandboxError(AlignflowError):
    """A sandbox run could not be carried out (the supervisor failed, the remote service refused)."""


class SandboxUnavailableError(SandboxError):
    """The sandbox cannot start here; the message names the missing mechanism."""
