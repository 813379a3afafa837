"""Choosing a sandbox by config: this machine's (`local`) or the chart's sandbox service (`remote`).

Both backends have one contract (`Sandbox`): `run_python(code, limits=...)` returns a SandboxResult and
`check()`, called once at start-up, raises SandboxUnavailableError naming what is missing.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Protocol

from trainer.config.sandbox import SandboxConfig
from trainer.sandbox.contract import SandboxLimits, SandboxResult, SandboxUnavailableError
from trainer.sandbox.local import check_sandbox, run_python
from trainer.sandbox.remote import RemoteSandbox


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


def build_sandbox(config: SandboxConfig, environ: Mapping[str, str] = os.environ) -> Sandbox:
    """The sandbox `config` names; the remote one takes its token from `environ[config.token_env]`."""
    if config.backend == "remote":
        token = environ.get(config.token_env, "")
        if not token:
            raise SandboxUnavailableError(f"sandbox service {config.url}: the token variable {config.token_env} is "
                                          "empty or unset (mount the service's Secret into it)")
        return RemoteSandbox(config.url, token)
    return LocalSandbox(config.interpreter)
