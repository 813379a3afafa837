"""The sandbox's config sections: the limits of one run of untrusted code, and which sandbox runs it.

Declared here, with the other config sections, because a stage config holds them (a `code_tests` reward
source's `sandbox`); the sandbox itself is `trainer.sandbox` (docs/sandbox.md).
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, model_validator

from trainer.config.sections import Section
from trainer.secret_keys import SANDBOX_TOKEN_VARIABLE


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
        "run is killed and the result says memory_exceeded). Where the scratch folder is a tmpfs, the run's files "
        "there count too, being memory. At least 64 MiB (the interpreter needs about 30)."))
    max_processes: int = Field(16, ge=1, le=1024, description=(
        "How many more processes and threads the program may start (RLIMIT_NPROC above the uid's current "
        "count); a fork past it fails with EAGAIN."))
    max_output_bytes: int = Field(1 << 20, ge=1, le=64 << 20, description=(
        "Bytes of stdout and stderr together that are kept; past this the program is killed and the result "
        "says truncated."))
    max_file_bytes: int = Field(64 << 20, ge=0, description=(
        "Largest file the program may write in its scratch folder (RLIMIT_FSIZE); a larger write fails."))
    max_scratch_bytes: int = Field(256 << 20, ge=1 << 20, description=(
        "Bytes all the run's files may take together: its scratch folder (allocated blocks, plus 1 KiB a name) "
        "and the files it deleted but still holds open or mapped; checked every 0.1 s: past it the run is "
        "killed and the result says scratch_exceeded. At least 1 MiB."))


class SandboxConfig(Section):
    """Which sandbox runs model-written code (`trainer.sandbox.build_sandbox`), and its limits."""

    backend: Literal["local", "remote"] = Field("local", description=(
        "Where model-written code runs: `local` (this pod, confined by Landlock, seccomp and rlimits; needs "
        "Linux 6.12+) or `remote` (the chart's sandbox service at `url`)."))
    limits: SandboxLimits = Field(default_factory=SandboxLimits, description="Limits of each run.")
    url: str | None = Field(None, description=(
        "Base URL of the sandbox service (`http://<release>-alignflow-sandbox.<namespace>.svc:8080`); "
        "required with backend `remote`."))
    token_env: str = Field(SANDBOX_TOKEN_VARIABLE, description=(
        "Environment variable holding the service's bearer token (from a Kubernetes Secret); never logged."))
    interpreter: str | None = Field(None, description=(
        "Python that runs the code with backend `local` (`-I -S`: standard library only); default: the "
        "trainer's own."))

    @model_validator(mode="after")
    def _remote_needs_a_url(self) -> SandboxConfig:
        if self.backend == "remote" and not self.url:
            raise ValueError("url is required when backend is remote")
        return self
