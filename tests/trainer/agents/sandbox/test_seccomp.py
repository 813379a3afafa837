"""The seccomp filter on its own (no Landlock): sockets and namespaces refused, threads and pipes work."""

from __future__ import annotations

import ctypes
import os
import platform
import socket
import struct
import threading

import pytest

from tests.trainer.agents.sandbox.forked import error_name, in_child
from trainer.agents.sandbox import _landlock, _seccomp


def test_the_program_starts_with_the_machines_audit_arch_and_knows_two_machines():
    for machine, (audit_arch, _) in _seccomp.ARCHITECTURES.items():
        program = _seccomp.build_filter(machine)
        assert len(program) % 8 == 0 and len(program) // 8 < 4096  # BPF_MAXINSNS
        assert struct.unpack("=HBBI", program[8:16])[3] == audit_arch  # the JEQ after loading the arch
    with pytest.raises(_seccomp.SeccompError, match="no syscall table for machine 'riscv64'"):
        _seccomp.build_filter("riscv64")


def unshare_user_namespace() -> None:
    """unshare(CLONE_NEWUSER) through libc (os.unshare is Python 3.12+)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(0x10000000) != 0:
        raise OSError(ctypes.get_errno(), "unshare")


@pytest.mark.skipif(platform.machine() not in _seccomp.ARCHITECTURES, reason="no syscall table for this machine")
def test_sockets_and_namespaces_are_refused_and_ordinary_work_goes_on():
    def filtered():
        _landlock.set_no_new_privs()
        _seccomp.install_filter(_seccomp.build_filter())
        results = {}
        thread = threading.Thread(target=lambda: results.setdefault("thread", "ran"))  # clone3 falls back to clone
        thread.start()
        thread.join()
        left, right = socket.socketpair()
        left.sendall(b"x")
        return {**results, "socketpair": right.recv(1).decode(),
                "udp": error_name(lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM)),
                "unix socket": error_name(lambda: socket.socket(socket.AF_UNIX)),
                "user namespace": error_name(unshare_user_namespace),
                "fork": error_name(lambda: os.waitpid(pid, 0) if (pid := os.fork()) else os._exit(0))}

    assert in_child(filtered) == {"thread": "ran", "socketpair": "x", "udp": "EPERM", "unix socket": "EPERM",
                                  "user namespace": "EPERM", "fork": "ok"}


HEADERS = {"x86_64": "/usr/include/x86_64-linux-gnu/asm/unistd_64.h", "aarch64": "/usr/include/asm-generic/unistd.h"}


@pytest.mark.parametrize("machine", HEADERS)
def test_the_syscall_numbers_are_the_kernels(machine):
    """Checked against the Linux UAPI headers where they are installed (linux-libc-dev)."""
    import re
    from pathlib import Path

    header = Path(HEADERS[machine])
    if not header.exists():
        pytest.skip(f"{header} is not installed")
    numbers = {name: int(number) for name, number in re.findall(r"#define __NR(?:3264)?_(\w+)\s+(\d+)\b",
                                                                 header.read_text())}
    assert {name: numbers.get(name) for name in _seccomp.ARCHITECTURES[machine][1]} == \
        _seccomp.ARCHITECTURES[machine][1]
