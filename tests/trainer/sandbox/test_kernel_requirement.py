"""On a kernel that cannot hold the local sandbox, every test that runs code in it skips, naming the kernel."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

from tests.trainer.sandbox import kernel
from trainer.sandbox import _landlock, _seccomp

REPOSITORY = Path(__file__).parents[3]


def test_the_reason_names_the_kernel_and_landlock_abi_needed(monkeypatch):
    monkeypatch.setattr(_landlock, "abi_version", lambda: 4)
    reason = kernel.local_sandbox_unavailable("x86_64")
    assert "Linux 6.12+" in reason and "ABI 6" in reason and "has Landlock ABI 4" in reason

    def no_landlock():
        raise _landlock.LandlockError(errno.ENOSYS, "Landlock unavailable: the kernel has no Landlock (ENOSYS)")

    monkeypatch.setattr(_landlock, "abi_version", no_landlock)
    assert kernel.local_sandbox_unavailable("x86_64").endswith("the kernel has no Landlock (ENOSYS)")
    assert "this machine is riscv64" in kernel.local_sandbox_unavailable("riscv64")


def without_landlock() -> None:
    """In the child before exec: a filter that answers ENOSYS to Landlock's three calls, as a kernel before
    5.13 (or one without Landlock in `lsm=`) does. It is inherited by every process the tests start."""
    instructions = [_seccomp._instruction(_seccomp.LD_W_ABS, _seccomp.NR_OFFSET)]
    for number in (_landlock.CREATE_RULESET, _landlock.ADD_RULE, _landlock.RESTRICT_SELF):
        instructions += [_seccomp._instruction(_seccomp.JEQ_K, number, 0, 1), _seccomp._denial(errno.ENOSYS)]
    instructions.append(_seccomp._instruction(_seccomp.RET_K, _seccomp.RET_ALLOW))
    _landlock.set_no_new_privs()
    _seccomp.install_filter(b"".join(instructions))


def test_without_landlock_the_code_running_tests_skip_and_none_fails():
    if os.uname().machine not in _seccomp.ARCHITECTURES:
        kernel.skip_without_the_local_sandbox()
    paths = ["tests/trainer/sandbox", "tests/trainer/agents/test_tools.py"]
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", "-rs",
                           "-k", "not without_landlock", *paths], cwd=REPOSITORY, capture_output=True, text=True,
                          timeout=300, preexec_fn=without_landlock)
    summary = done.stdout.strip().splitlines()[-1]
    assert done.returncode == 0, done.stdout[-3000:]
    assert "skipped" in summary and "failed" not in summary and "error" not in summary, summary
    skips = [line for line in done.stdout.splitlines() if line.startswith("SKIPPED")]
    needs = [line for line in skips if "needs Linux 6.12+ with Landlock enabled (ABI 6" in line]
    assert len(needs) >= 30, "\n".join(skips)
