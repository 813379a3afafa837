"""The seccomp filter on its own (no Landlock): sockets and namespaces refused, threads and pipes work."""

from __future__ import annotations

import ctypes
import os
import platform
import socket
import struct
import threading

import pytest

from tests.trainer.sandbox.forked import error_name, in_child
from trainer.sandbox import _landlock, _seccomp


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


@pytest.mark.skipif(platform.machine() not in _seccomp.ARCHITECTURES, reason="no syscall table for this machine")
def test_metadata_system_v_ipc_memfds_and_watches_are_refused_and_files_still_work(tmp_path):
    """The calls Landlock does not govern, on the filter alone (so this holds on any kernel with seccomp)."""
    planted = tmp_path / "owned.txt"
    planted.write_text("kept")
    os.chmod(planted, 0o600)

    def filtered():
        _landlock.set_no_new_privs()
        _seccomp.install_filter(_seccomp.build_filter())
        libc = ctypes.CDLL(None, use_errno=True)

        def ipc(call):
            if call() == -1:
                raise OSError(ctypes.get_errno(), "ipc")

        (tmp_path / "written.txt").write_text("fine")
        return {"chmod": error_name(lambda: os.chmod(planted, 0o644)),
                "chown": error_name(lambda: os.chown(planted, os.getuid(), os.getgid())),
                "utime": error_name(lambda: os.utime(planted, (0, 0))),
                "setxattr": error_name(lambda: os.setxattr(planted, "user.x", b"1")),
                "shmget": error_name(lambda: ipc(lambda: libc.shmget(0, 4096, 0o1600))),
                "semget": error_name(lambda: ipc(lambda: libc.semget(0, 1, 0o1600))),
                "msgget": error_name(lambda: ipc(lambda: libc.msgget(0, 0o1600))),
                "memfd": error_name(lambda: os.memfd_create("held")),
                "inotify": error_name(lambda: ipc(lambda: libc.inotify_init1(0))),
                "read and stat": open(planted).read() + oct(os.stat(planted).st_mode & 0o777)}

    assert in_child(filtered) == {"chmod": "EPERM", "chown": "EPERM", "utime": "EPERM", "setxattr": "EPERM",
                                  "shmget": "EPERM", "semget": "EPERM", "msgget": "EPERM", "memfd": "EPERM",
                                  "inotify": "EPERM", "read and stat": "kept0o600"}
    assert (tmp_path / "written.txt").read_text() == "fine"


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
    # Calls newer than these headers: where the headers know one, the number agrees; else it lies past them.
    newest = max(numbers.values())
    for name, number in _seccomp.NEWER_SYSCALLS.items():
        assert numbers.get(name, number) == number and (name in numbers or number > newest), name


def test_every_denied_call_has_a_number_on_each_machine_or_is_a_legacy_one_the_machine_lacks():
    for machine, (_, numbers) in _seccomp.ARCHITECTURES.items():
        known = {**_seccomp.NEWER_SYSCALLS, **numbers}
        missing = {name for name in _seccomp.DENIED if name not in known}
        legacy = {"chmod", "chown", "lchown", "utime", "utimes", "futimesat", "inotify_init"}  # x86_64 only
        assert missing == (legacy if machine == "aarch64" else set()), machine
