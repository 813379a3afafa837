"""What a sandbox run takes and gives: its limits, its result, and its errors.

Kept free of any mechanism so the local sandbox, the remote client and the server share one vocabulary.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from pydantic import ConfigDict, Field

from trainer.config.sections import Section
from trainer.errors import AlignflowError


class SandboxLimits(Section):
    """Limits of one run of untrusted code. The defaults suit a short computation a model writes."""

    model_config = ConfigDict(frozen=True, validate_assignment=False)

    wall_seconds: float = Field(10.0, gt=0, le=3600, description=(
        "Wall-clock limit in seconds; when it passes, every process the program started is killed and the "
        "result says timed_out."))
    cpu_seconds: int = Field(10, ge=1, le=3600, description=(
        "CPU time limit in seconds of each process (RLIMIT_CPU): SIGXCPU when it is used up, SIGKILL a second "
        "later."))
    memory_bytes: int = Field(1 << 30, ge=64 << 20, description=(
        "Memory limit in bytes: the address space of each process (RLIMIT_AS: a larger allocation fails with "
        "MemoryError) and the resident memory of all the run's processes together (checked every 0.1 s: the "
        "run is killed and the result says memory_exceeded). At least 64 MiB (the interpreter needs about 30)."))
    max_processes: int = Field(16, ge=1, le=1024, description=(
        "How many more processes and threads the program may start (RLIMIT_NPROC above the uid's current "
        "count); a fork past it fails with EAGAIN."))
    max_output_bytes: int = Field(1 << 20, ge=1, le=64 << 20, description=(
        "Bytes of stdout and stderr together that are kept; past this the program is killed and the result "
        "says truncated."))
    max_file_bytes: int = Field(64 << 20, ge=0, description=(
        "Largest file the program may write in its scratch folder (RLIMIT_FSIZE); a larger write fails."))


@dataclass(frozen=True, slots=True)
class SandboxResult:
    """What a run of untrusted code produced."""

    stdout: str
    """Standard output, decoded as UTF-8 (invalid bytes replaced), cut at `max_output_bytes`."""
    stderr: str
    """Standard error, likewise; it shares the `max_output_bytes` budget with stdout."""
    exit_code: int | None
    """The program's exit status (negative: killed by that signal, e.g. -24 for SIGXCPU); None when the
    sandbox stopped it (timed out, truncated or memory exceeded)."""
    timed_out: bool
    """The wall-clock limit passed and the process tree was killed."""
    truncated: bool
    """The output outgrew `max_output_bytes`: it was cut and the process tree was killed."""
    memory_exceeded: bool = False
    """The run's processes together held more than `memory_bytes`, and the process tree was killed."""

    def to_dict(self) -> dict:
        """The result as JSON-ready data (the remote service's response body)."""
        return asdict(self)


class SandboxError(AlignflowError):
    """A sandbox run could not be carried out (the supervisor failed, the remote service refused)."""


class SandboxUnavailableError(SandboxError):
    """The sandbox cannot start here; the message names the missing mechanism."""
