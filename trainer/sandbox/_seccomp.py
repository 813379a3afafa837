"""A seccomp filter as raw classic BPF (struct + ctypes, no library): no sockets, no namespaces, no io_uring.

Standard library only: the supervisor (`_supervisor.py`) imports this file by name under `python -I -S`.
Landlock denies TCP but not UDP, raw or netlink sockets, so the sandboxed code may not create a socket at
all (`socketpair(AF_UNIX)`, which multiprocessing and asyncio use inside the process tree, stays). It is
also refused what would reach past Landlock or the kernel's checks on this uid: io_uring (its own socket
and file operations), ptrace and cross-process memory access, namespaces (`unshare`, `setns`, namespace
flags of `clone`; `clone3` answers ENOSYS, whose flags a filter cannot read, so the C library falls back
to `clone`), the kernel keyring, eBPF, perf events, userfaultfd and mounts; and what Landlock does not
govern: changing a file's mode, owner, times or extended attributes (which needs only ownership, not
access), System V IPC (owned by the uid, outliving the run), memfds (memory no limit counts) and inotify or
fanotify (names of files in folders the program may not open). A call from another syscall ABI
(i386 or x32 on x86_64) kills the process: the numbers below hold only for the native one.
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct

SECCOMP_SET_MODE_FILTER = 1
RET_KILL_PROCESS, RET_ERRNO, RET_ALLOW = 0x80000000, 0x00050000, 0x7FFF0000
LD_W_ABS, JEQ_K, JGE_K, JSET_K, RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
NR_OFFSET, ARCH_OFFSET, ARG0_OFFSET = 0, 4, 16  # struct seccomp_data, little-endian: arg 0's low word at 16
AF_UNIX = 1
NAMESPACE_FLAGS = 0x7E020080  # CLONE_NEWNS|NEWCGROUP|NEWUTS|NEWIPC|NEWUSER|NEWPID|NEWNET|NEWTIME

# (AUDIT_ARCH, syscall numbers) per machine: x86_64's own table; aarch64 uses the generic one.
ARCHITECTURES = {
    "x86_64": (0xC000003E, {
        "socket": 41, "socketpair": 53, "clone": 56, "clone3": 435, "ptrace": 101, "process_vm_readv": 310,
        "process_vm_writev": 311, "unshare": 272, "setns": 308, "io_uring_setup": 425, "io_uring_enter": 426,
        "io_uring_register": 427, "bpf": 321, "perf_event_open": 298, "userfaultfd": 323, "keyctl": 250,
        "add_key": 248, "request_key": 249, "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161,
        "open_by_handle_at": 304, "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431,
        "fsmount": 432, "fspick": 433, "seccomp": 317,
        "chmod": 90, "fchmod": 91, "fchmodat": 268, "chown": 92, "fchown": 93, "lchown": 94, "fchownat": 260,
        "utime": 132, "utimes": 235, "futimesat": 261, "utimensat": 280, "setxattr": 188, "lsetxattr": 189,
        "fsetxattr": 190, "removexattr": 197, "lremovexattr": 198, "fremovexattr": 199,
        "shmget": 29, "shmat": 30, "shmctl": 31, "shmdt": 67, "semget": 64, "semop": 65, "semctl": 66,
        "semtimedop": 220, "msgget": 68, "msgsnd": 69, "msgrcv": 70, "msgctl": 71,
        "memfd_create": 319, "memfd_secret": 447, "inotify_init": 253, "inotify_init1": 294, "fanotify_init": 300}),
    "aarch64": (0xC00000B7, {
        "socket": 198, "socketpair": 199, "clone": 220, "clone3": 435, "ptrace": 117, "process_vm_readv": 270,
        "process_vm_writev": 271, "unshare": 97, "setns": 268, "io_uring_setup": 425, "io_uring_enter": 426,
        "io_uring_register": 427, "bpf": 280, "perf_event_open": 241, "userfaultfd": 282, "keyctl": 219,
        "add_key": 217, "request_key": 218, "mount": 40, "umount2": 39, "pivot_root": 41, "chroot": 51,
        "open_by_handle_at": 265, "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431,
        "fsmount": 432, "fspick": 433, "seccomp": 277,
        "fchmod": 52, "fchmodat": 53, "fchown": 55, "fchownat": 54, "utimensat": 88, "setxattr": 5,
        "lsetxattr": 6, "fsetxattr": 7, "removexattr": 14, "lremovexattr": 15, "fremovexattr": 16,
        "shmget": 194, "shmat": 196, "shmctl": 195, "shmdt": 197, "semget": 190, "semop": 193, "semctl": 191,
        "semtimedop": 192, "msgget": 186, "msgsnd": 189, "msgrcv": 188, "msgctl": 187,
        "memfd_create": 279, "memfd_secret": 447, "inotify_init1": 26, "fanotify_init": 262}),
}
# Calls newer than the UAPI headers the tests check against (linux-libc-dev of Debian bookworm: Linux 6.1);
# numbered in the unified table, the same on x86_64 and aarch64. An older kernel answers ENOSYS for them anyway.
NEWER_SYSCALLS = {"fchmodat2": 452, "setxattrat": 463, "removexattrat": 466, "file_setattr": 469}
# What the program may not do. Legacy calls a machine's table lacks (aarch64 has no chmod, chown, utime,
# inotify_init...) are skipped for it: its C library uses the *at forms, which are denied.
NETWORK_AND_ISOLATION = ("socket", "ptrace", "process_vm_readv", "process_vm_writev", "unshare", "setns",
                         "io_uring_setup", "io_uring_enter", "io_uring_register", "bpf", "perf_event_open",
                         "userfaultfd", "keyctl", "add_key", "request_key", "mount", "umount2", "pivot_root",
                         "chroot", "open_by_handle_at", "open_tree", "move_mount", "fsopen", "fsconfig",
                         "fsmount", "fspick")
# Landlock governs a file's contents and names, not its metadata: mode, owner, times and extended attributes
# of a file the uid owns outside the scratch folder (the run's checkpoints) would be the program's to change.
METADATA = ("chmod", "fchmod", "fchmodat", "fchmodat2", "chown", "fchown", "lchown", "fchownat", "utime",
            "utimes", "futimesat", "utimensat", "setxattr", "lsetxattr", "fsetxattr", "setxattrat", "removexattr",
            "lremovexattr", "fremovexattr", "removexattrat", "file_setattr")
# System V IPC objects belong to the uid, not to the Landlock domain: they would reach the trainer's segments
# and outlive the run, uncounted.
SYSTEM_V_IPC = ("shmget", "shmat", "shmctl", "shmdt", "semget", "semop", "semctl", "semtimedop", "msgget",
                "msgsnd", "msgrcv", "msgctl")
# Memory no limit counts: a memfd's pages are neither resident in a process nor its address space until mapped.
UNCOUNTED_MEMORY = ("memfd_create", "memfd_secret")
# inotify and fanotify watch folders Landlock does not let the program open, and report the names written there.
FILE_WATCHES = ("inotify_init", "inotify_init1", "fanotify_init")
DENIED = NETWORK_AND_ISOLATION + METADATA + SYSTEM_V_IPC + UNCOUNTED_MEMORY + FILE_WATCHES
X32_SYSCALL_BIT = 0x40000000


class SeccompError(OSError):
    """This machine, kernel or container profile cannot install the filter."""


def _instruction(code: int, k: int, true_offset: int = 0, false_offset: int = 0) -> bytes:
    return struct.pack("=HBBI", code, true_offset, false_offset, k)


def _denial(error: int) -> bytes:
    return _instruction(RET_K, RET_ERRNO | error)


def build_filter(machine: str | None = None, *, extra_denials: dict[int, int] | None = None) -> bytes:
    """The BPF program (a sequence of struct sock_filter) for `machine` (default: this one).

    Args:
        machine: `uname -m` of the target; x86_64 and aarch64 are known.
        extra_denials: More syscall numbers to refuse, each with the errno to answer (the tests use it to
            stand for a kernel or container profile that lacks a mechanism).

    Raises:
        SeccompError: The machine's syscall table is not known here.
    """
    machine = machine or os.uname().machine
    if machine not in ARCHITECTURES:
        raise SeccompError(errno.ENOTSUP, f"seccomp filter: no syscall table for machine {machine!r} "
                                          f"(known: {', '.join(ARCHITECTURES)})")
    audit_arch, numbers = ARCHITECTURES[machine]
    program = [_instruction(LD_W_ABS, ARCH_OFFSET), _instruction(JEQ_K, audit_arch, 1, 0),
               _instruction(RET_K, RET_KILL_PROCESS), _instruction(LD_W_ABS, NR_OFFSET)]
    if machine == "x86_64":
        program += [_instruction(JGE_K, X32_SYSCALL_BIT, 0, 1), _instruction(RET_K, RET_KILL_PROCESS)]
    numbers = {**NEWER_SYSCALLS, **numbers}
    denials = {numbers[name]: errno.EPERM for name in DENIED if name in numbers} | {numbers["clone3"]: errno.ENOSYS}
    denials |= extra_denials or {}
    for number, error in denials.items():
        program += [_instruction(JEQ_K, number, 0, 1), _denial(error)]
    # socketpair: AF_UNIX only. clone: no namespace flags. Each block returns, so A may be overwritten.
    program += [_instruction(JEQ_K, numbers["socketpair"], 0, 4), _instruction(LD_W_ABS, ARG0_OFFSET),
                _instruction(JEQ_K, AF_UNIX, 0, 1), _instruction(RET_K, RET_ALLOW), _denial(errno.EPERM)]
    program += [_instruction(JEQ_K, numbers["clone"], 0, 4), _instruction(LD_W_ABS, ARG0_OFFSET),
                _instruction(JSET_K, NAMESPACE_FLAGS, 0, 1), _denial(errno.EPERM), _instruction(RET_K, RET_ALLOW)]
    program.append(_instruction(RET_K, RET_ALLOW))
    return b"".join(program)


def install_filter(program: bytes, machine: str | None = None) -> None:
    """Load `program` into this thread and every process it starts; needs PR_SET_NO_NEW_PRIVS first.

    Raises:
        SeccompError: The kernel has no seccomp filters, or a container profile refuses the call.
    """
    machine = machine or os.uname().machine
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    code = ctypes.create_string_buffer(program, len(program))

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    fprog = SockFprog(len(program) // 8, ctypes.cast(code, ctypes.c_void_p))
    number = ARCHITECTURES[machine][1]["seccomp"]
    if libc.syscall(ctypes.c_long(number), ctypes.c_uint(SECCOMP_SET_MODE_FILTER), ctypes.c_uint(0),
                    ctypes.byref(fprog)) != 0:
        error = ctypes.get_errno()
        raise SeccompError(error, f"seccomp filter could not be installed: seccomp(SECCOMP_SET_MODE_FILTER) "
                                  f"answered {errno.errorcode.get(error, error)} ({os.strerror(error)})")
