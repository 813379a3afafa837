"""Choosing a sandbox by config: this machine's (`local`) or the chart's sandbox service (`remote`).

Both backends have one contract (`Sandbox`): `run_python(code, limits=...)` returns a SandboxResult and
`check()`, called once at start-up, raises SandboxUnavailableError naming what is missing.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Literal, Protocol

from pydantic import Field, model_validator

from trainer.agents.sandbox.contract import SandboxLimits, SandboxResult, SandboxUnavailableError
from trainer.agents.sandbox.local import check_sandbox, run_python
from trainer.agents.sandbox.remote import RemoteSandbox
from trainer.config.sections import Section


class Sandbox(Protocol):
    """What runs a program the model wrote."""

    def run_python(self, code: str, *, limits: SandboxLimits | None = None) -> SandboxResult: ...

    def check(self, limits: SandboxLimits | None = None) -> None: ...


class LocalSandbox:
    """The sandbox on this machine (Landlock, seccomp, rlimits), run with `interpreter`."""

    def __init__(self, interpreter: str | None = None):
        self.interpreter = interpreter

    def run_python(self, code: str, *, limits: SandboxLimits | None = None) -> SandboxResult:
        return run_python(code, limits=limits, interpreter=self.interpreter)

    def check(self, limits: SandboxLimits | None = None) -> None:
        check_sandbox(interpreter=self.interpreter)


class SandboxConfig(Section):
    backend: Literal["local", "remote"] = Field("local", description=(
        "Where model-written code runs: `local` (this pod, confined by Landlock, seccomp and rlimits; needs "
        "Linux 6.12+) or `remote` (the chart's sandbox service at `url`)."))
    limits: SandboxLimits = Field(default_factory=SandboxLimits, description="Limits of each run.")
    url: str | None = Field(None, description=(
        "Base URL of the sandbox service (`http://<release>-alignflow-sandbox.<namespace>.svc:8080`); "
        "required with backend `remote`."))
    token_env: str = Field("ALIGNFLOW_SANDBOX_TOKEN", description=(
        "Environment variable holding the service's bearer token (from a Kubernetes Secret); never logged."))
    interpreter: str | None = Field(None, description=(
        "Python that runs the code with backend `local` (`-I -S`: standard library only); default: the "
        "trainer's own."))

    @model_validator(mode="after")
    def _remote_needs_a_url(self) -> SandboxConfig:
        if self.backend == "remote" and not self.url:
            raise ValueError("url is required when backend is remote")
        return self


def build_sandbox(config: SandboxConfig, environ: Mapping[str, str] = os.environ) -> Sandbox:
    """The sandbox `config` names; the remote one takes its token from `environ[config.token_env]`."""
    if config.backend == "remote":
        token = environ.get(config.token_env, "")
        if not token:
            raise SandboxUnavailableError(f"sandbox service {config.url}: the token variable {config.token_env} is "
                                          "empty or unset (mount the service's Secret into it)")
        return RemoteSandbox(config.url, token)
    return LocalSandbox(config.interpreter)
