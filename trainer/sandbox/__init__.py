"""The code-execution sandbox: run untrusted Python with no network, no credentials and hard limits.

`run_python(code, limits=...)` runs a program on this machine (Landlock, seccomp, rlimits; see
docs/sandbox.md) and `check_sandbox()` proves once at start-up that it can start and holds here.
`RemoteSandbox` runs the same contract on the chart's sandbox service; `build_sandbox(config)` picks one.
"""

from trainer.sandbox.config import LocalSandbox, Sandbox, SandboxConfig, build_sandbox
from trainer.sandbox.contract import SandboxError, SandboxLimits, SandboxResult, SandboxUnavailableError
from trainer.sandbox.local import check_sandbox, run_python
from trainer.sandbox.remote import RemoteSandbox

__all__ = ["LocalSandbox", "RemoteSandbox", "Sandbox", "SandboxConfig", "SandboxError", "SandboxLimits",
           "SandboxResult", "SandboxUnavailableError", "build_sandbox", "check_sandbox", "run_python"]
