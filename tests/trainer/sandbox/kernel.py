"""Whether this kernel can hold the local sandbox; tests that run code in it skip, naming the need, where not.

The local sandbox needs Landlock ABI 6 (Linux 6.12+: signal and abstract-socket scoping) and a seccomp
syscall table for the machine (x86_64, aarch64). On an older kernel, or where Landlock is off, the tests that
run code in it skip with that reason. Only the kernel is asked: on a kernel that can hold the sandbox, a
sandbox that does not start is a failure, never a skip.

Tests elsewhere that run code in the local sandbox call `skip_without_the_local_sandbox()` first.
"""

from __future__ import annotations

import os

import pytest

from trainer.sandbox import _landlock, _seccomp

KERNEL_REQUIREMENT = (f"Linux 6.12+ with Landlock enabled (ABI {_landlock.minimum_abi}, for signal scoping) and "
                      f"seccomp on {' or '.join(_seccomp.ARCHITECTURES)}")


def local_sandbox_unavailable(machine: str | None = None) -> str | None:
    """Why this kernel cannot hold the local sandbox, or None when it can."""
    machine = machine or os.uname().machine
    release = os.uname().release
    if machine not in _seccomp.ARCHITECTURES:
        return f"the local sandbox needs {KERNEL_REQUIREMENT}; this machine is {machine}"
    try:
        abi = _landlock.abi_version()
    except _landlock.LandlockError as err:
        return f"the local sandbox needs {KERNEL_REQUIREMENT}; this kernel ({release}): {err.strerror}"
    if abi < _landlock.minimum_abi:
        return f"the local sandbox needs {KERNEL_REQUIREMENT}; this kernel ({release}) has Landlock ABI {abi}"
    return None


def skip_without_the_local_sandbox() -> None:
    """Skip the calling test, naming the kernel it needs, where this kernel cannot hold the local sandbox."""
    reason = local_sandbox_unavailable()
    if reason is not None:
        pytest.skip(reason)
