"""Landlock through raw syscalls (ctypes): filesystem rules, TCP rules and scoping, unprivileged.

Standard library only: the supervisor (`_supervisor.py`) imports this file by name under `python -I -S`.
Landlock (Linux 5.13+, https://docs.kernel.org/userspace-api/landlock.html) lets any process restrict
itself and all its future children, after `prctl(PR_SET_NO_NEW_PRIVS)`, and the restriction can never be
lifted. A ruleset names the rights it *handles*; a handled right is denied everywhere except beneath the
paths (or on the TCP ports) a rule grants it for. Rights an ABI does not know are dropped from the request,
so one ruleset works on every ABI; the sandbox asks for ABI 6 (`minimum_abi`) because it relies on signal
scoping.

The syscall numbers (444, 445, 446) are the same on x86_64 and aarch64 (Linux's unified table since 5.x).
"""

from __future__ import annotations

import ctypes
import os
import struct

CREATE_RULESET, ADD_RULE, RESTRICT_SELF = 444, 445, 446
CREATE_RULESET_VERSION = 1 << 0
RULE_PATH_BENEATH, RULE_NET_PORT = 1, 2
PR_SET_NO_NEW_PRIVS = 38

# Filesystem rights, with the ABI that introduced each.
FS_EXECUTE, FS_WRITE_FILE, FS_READ_FILE, FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
FS_REMOVE_DIR, FS_REMOVE_FILE, FS_MAKE_CHAR, FS_MAKE_DIR = 1 << 4, 1 << 5, 1 << 6, 1 << 7
FS_MAKE_REG, FS_MAKE_SOCK, FS_MAKE_FIFO, FS_MAKE_BLOCK, FS_MAKE_SYM = 1 << 8, 1 << 9, 1 << 10, 1 << 11, 1 << 12
FS_REFER, FS_TRUNCATE, FS_IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
FS_RIGHTS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 5: (1 << 16) - 1}
# The rights a rule on a regular file (not a directory) may carry.
FILE_RIGHTS = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV
READ_AND_EXECUTE = FS_EXECUTE | FS_READ_FILE | FS_READ_DIR
# TCP rights (ABI 4) and scopes (ABI 6).
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1

minimum_abi = 6


class LandlockError(OSError):
    """Landlock is missing, too old, or refused a call."""


def _syscall(number: int, *args) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    result = libc.syscall(ctypes.c_long(number), *args)
    if result < 0:
        errno = ctypes.get_errno()
        raise LandlockError(errno, os.strerror(errno))
    return result


def abi_version() -> int:
    """The kernel's Landlock ABI version; raises LandlockError when Landlock is absent or disabled."""
    try:
        return _syscall(CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(CREATE_RULESET_VERSION))
    except LandlockError as err:
        reasons = {38: "the kernel has no Landlock (ENOSYS) or a seccomp profile blocks it",
                   95: "Landlock is built in but not enabled at boot (EOPNOTSUPP: add landlock to the lsm= list)",
                   1: "a seccomp profile refuses the landlock syscalls (EPERM)"}
        raise LandlockError(err.errno, f"Landlock unavailable: {reasons.get(err.errno, err.strerror)}") from err


def fs_rights(abi: int) -> int:
    """Every filesystem right the ABI `abi` handles."""
    return FS_RIGHTS_BY_ABI[max(version for version in FS_RIGHTS_BY_ABI if version <= abi)]


def set_no_new_privs() -> None:
    """prctl(PR_SET_NO_NEW_PRIVS, 1): required before an unprivileged Landlock or seccomp restriction."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, ctypes.c_ulong(1), ctypes.c_ulong(0), ctypes.c_ulong(0),
                  ctypes.c_ulong(0)) != 0:
        errno = ctypes.get_errno()
        raise LandlockError(errno, f"prctl(PR_SET_NO_NEW_PRIVS) failed: {os.strerror(errno)}")


def restrict_self(*, read_paths: list[str] = (), write_paths: list[str] = (), device_files: list[str] = (),
                  handle_fs: bool = True, handle_tcp: bool = True) -> int:
    """Confine this process and its future children; returns the ABI used.

    Args:
        read_paths: Paths (folders or files) whose contents may be read and executed.
        write_paths: Folders in which anything may be done (read, write, create, remove).
        device_files: Files that may be read and written (such as /dev/null).
        handle_fs: Whether to restrict the filesystem at all; False gives a scoping-only domain.
        handle_tcp: Whether to deny every TCP bind and connect (ABI 4 and newer).

    Raises:
        LandlockError: The kernel's ABI is older than `minimum_abi`, or a syscall failed.
    """
    abi = abi_version()
    if abi < minimum_abi:
        raise LandlockError(95, f"Landlock ABI {abi} is too old: the sandbox needs ABI {minimum_abi} (Linux 6.12+) "
                                "for signal scoping")
    handled_fs = fs_rights(abi) if handle_fs else 0
    handled_net = NET_BIND_TCP | NET_CONNECT_TCP if handle_tcp else 0
    attributes = struct.pack("=QQQ", handled_fs, handled_net, SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL)
    buffer = ctypes.create_string_buffer(attributes, len(attributes))
    ruleset = _syscall(CREATE_RULESET, buffer, ctypes.c_size_t(len(attributes)), ctypes.c_uint32(0))
    try:
        if handled_fs:
            for path in read_paths:
                _allow_path(ruleset, path, READ_AND_EXECUTE & handled_fs)
            for path in write_paths:
                _allow_path(ruleset, path, handled_fs)
            for path in device_files:
                _allow_path(ruleset, path, (FS_READ_FILE | FS_WRITE_FILE) & handled_fs)
        set_no_new_privs()
        _syscall(RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0))
    finally:
        os.close(ruleset)
    return abi


def _allow_path(ruleset: int, path: str, rights: int) -> None:
    """Grant `rights` beneath `path` (only the file rights when `path` is not a folder)."""
    try:
        descriptor = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError as err:
        raise LandlockError(err.errno, f"cannot open {path} to grant it as uid {os.getuid()}: {err.strerror}") from err
    try:
        if not os.path.isdir(path):
            rights &= FILE_RIGHTS
        rule = struct.pack("=Qi", rights, descriptor)  # struct landlock_path_beneath_attr is packed
        buffer = ctypes.create_string_buffer(rule, len(rule))
        try:
            _syscall(ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(RULE_PATH_BENEATH), buffer, ctypes.c_uint32(0))
        except LandlockError as err:
            raise LandlockError(err.errno, f"Landlock refused a rule for {path}: {err.strerror}") from err
    finally:
        os.close(descriptor)
