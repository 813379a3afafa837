"""Escapes Landlock alone does not stop, each tried as the trainer image's uid: first shown to work without
the sandbox (the control), then refused inside it.

Metadata of the trainer's own files, System V IPC, memfd memory and file watches are the seccomp filter's
(`_seccomp.METADATA`, `SYSTEM_V_IPC`, `UNCOUNTED_MEMORY`, `FILE_WATCHES`); ptrace, cross-process memory,
io_uring, pidfds, /dev/shm and symlinks are held by the filter and Landlock together, and kept so here.
"""

from __future__ import annotations

import json
import os
import random
import textwrap

import pytest

from tests.trainer.sandbox.conftest import SECRET

# Each attempt prints "ok" or the errno's name; the program prints one JSON object of them.
ATTEMPTS = textwrap.dedent("""
    import ctypes, errno, json, os, struct
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    results = {}
    def attempt(name, action):
        try:
            action()
            results[name] = "ok"
        except OSError as err:
            results[name] = errno.errorcode.get(err.errno, str(err.errno))
    def checked(value):
        if value == -1 or value is None:
            number = ctypes.get_errno()
            raise OSError(number, os.strerror(number))
        return value
    def syscall(number, *arguments):
        return checked(libc.syscall(ctypes.c_long(number), *arguments))
""")


def outcomes(result: dict) -> dict:
    assert result["exit_code"] == 0, result["stderr"]
    return json.loads(result["stdout"])


@pytest.fixture
def trainers_file(stand_in):
    """A 0600 file of the trainer's uid outside the scratch folder (a checkpoint), with an xattr."""
    path = stand_in.output_dir / f"checkpoint-{random.randrange(1 << 30)}.pt"
    path.write_text("weights")
    os.chmod(path, 0o600)
    os.utime(path, (1_000_000_000, 1_000_000_000))
    try:
        os.setxattr(path, "user.kept", b"1")
    except OSError as err:
        path.unlink()
        pytest.skip(f"this filesystem takes no user xattrs ({err.strerror})")
    if os.geteuid() == 0:
        os.chown(path, stand_in.uid, stand_in.uid)
    yield path
    path.unlink(missing_ok=True)


def metadata_of(path) -> tuple:
    status = os.stat(path)
    return oct(status.st_mode & 0o7777), status.st_uid, status.st_mtime, sorted(os.listxattr(path))


def test_mode_times_owner_and_xattrs_of_the_trainers_files_stay_as_they_are(stand_in, trainers_file):
    """Landlock refuses opening the file; these calls need only ownership (`chmod 000` on the checkpoints)."""
    code = ATTEMPTS + textwrap.dedent(f"""
        path = {str(trainers_file)!r}
        attempt("chmod", lambda: os.chmod(path, 0o644))
        attempt("fchmodat2", lambda: syscall(452, -100, path.encode(), 0o666, 0))  # Linux 6.6+
        attempt("chown", lambda: os.chown(path, os.getuid(), os.getgid()))
        attempt("utime", lambda: os.utime(path, (0, 0)))
        attempt("setxattr", lambda: os.setxattr(path, "user.planted", b"1"))
        attempt("removexattr", lambda: os.removexattr(path, "user.kept"))
        value = ctypes.create_string_buffer(b"1")
        arguments = ctypes.create_string_buffer(struct.pack("=QII", ctypes.addressof(value), 1, 0), 16)
        attempt("setxattrat", lambda: syscall(463, -100, path.encode(), 0, b"user.again", arguments,
                                              ctypes.c_size_t(16)))  # Linux 6.13+
        print(json.dumps(results))
    """)
    before = metadata_of(trainers_file)
    assert before == ("0o600", stand_in.uid, 1_000_000_000, ["user.kept"])
    assert set(outcomes(stand_in.run_plain(code)).values()) == {"ok"}
    assert metadata_of(trainers_file) != before  # the control changed everything...
    os.chmod(trainers_file, 0o600)
    os.utime(trainers_file, (1_000_000_000, 1_000_000_000))
    for name in os.listxattr(trainers_file):
        os.removexattr(trainers_file, name)
    os.setxattr(trainers_file, "user.kept", b"1")
    inside = outcomes(stand_in.run(code))
    assert inside == dict.fromkeys(inside, "EPERM") and len(inside) == 7
    assert metadata_of(trainers_file) == before  # ...the sandboxed program nothing


SYSTEM_V = ATTEMPTS + textwrap.dedent("""
    libc.shmat.restype = ctypes.c_void_p
    IPC_CREAT, IPC_PRIVATE, SHM_RDONLY = 0o1000, 0, 0o10000
    def read_segment():
        identifier = checked(libc.shmget(ctypes.c_int(KEY), ctypes.c_size_t(0), 0))
        address = libc.shmat(identifier, None, SHM_RDONLY)
        if address in (None, 2**64 - 1):
            checked(-1)
        results["read"] = ctypes.string_at(address, SIZE).decode()
    attempt("shmget", read_segment)
    attempt("semget", lambda: checked(libc.semget(IPC_PRIVATE, 1, IPC_CREAT | 0o600)))
    attempt("msgget", lambda: checked(libc.msgget(IPC_PRIVATE, IPC_CREAT | 0o600)))
    attempt("leave a segment", lambda: results.setdefault(
        "left", checked(libc.shmget(IPC_PRIVATE, ctypes.c_size_t(1 << 20), IPC_CREAT | 0o600))))
    print(json.dumps(results))
""")
SYSTEM_V_CREATE = textwrap.dedent("""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    libc.shmat.restype = ctypes.c_void_p
    identifier = libc.shmget(ctypes.c_int(KEY), ctypes.c_size_t(4096), 0o1000 | 0o2000 | 0o600)
    address = libc.shmat(identifier, None, 0)
    ctypes.memmove(address, SECRET.encode(), len(SECRET))
    libc.shmdt(ctypes.c_void_p(address))
    print(identifier)
""")
# Segments, semaphore sets and queues of this uid, as `ipcs` sees them (the header line is skipped).
SYSTEM_V_LIST = textwrap.dedent("""
    import json, os
    found = []
    for kind in ("shm", "sem", "msg"):
        with open(f"/proc/sysvipc/{kind}") as table:
            header, *rows = table.read().splitlines()
            uid_column = header.split().index("uid")
            found += [[kind, int(row.split()[1])] for row in rows if int(row.split()[uid_column]) == os.getuid()]
    print(json.dumps(found))
""")
SYSTEM_V_REMOVE = textwrap.dedent("""
    import ctypes
    libc = ctypes.CDLL(None)
    for kind, identifier in OBJECTS:
        {"shm": lambda: libc.shmctl(identifier, 0, None), "sem": lambda: libc.semctl(identifier, 0, 0),
         "msg": lambda: libc.msgctl(identifier, 0, None)}[kind]()
""")


def test_system_v_ipc_of_the_trainers_uid_is_out_of_reach_and_nothing_is_left_behind(stand_in):
    key = random.randrange(1 << 20, 1 << 30)
    bind = f"KEY, SIZE, SECRET = {key}, {len(SECRET)}, {SECRET!r}\n"
    existing = json.loads(stand_in.run_plain(SYSTEM_V_LIST)["stdout"])
    created = stand_in.run_plain(bind + SYSTEM_V_CREATE)
    assert created["exit_code"] == 0, created["stderr"]
    try:
        plain = outcomes(stand_in.run_plain(bind + SYSTEM_V))
        assert plain["read"] == SECRET and plain["shmget"] == plain["semget"] == plain["msgget"] == "ok"
        assert plain["leave a segment"] == "ok"
        before = json.loads(stand_in.run_plain(SYSTEM_V_LIST)["stdout"])  # the trainer's, and the control's
        inside = outcomes(stand_in.run(bind + SYSTEM_V))
        assert inside == {"shmget": "EPERM", "semget": "EPERM", "msgget": "EPERM", "leave a segment": "EPERM"}
        assert json.loads(stand_in.run_plain(SYSTEM_V_LIST)["stdout"]) == before
    finally:
        mine = [entry for entry in json.loads(stand_in.run_plain(SYSTEM_V_LIST)["stdout"]) if entry not in existing]
        stand_in.run_plain(f"OBJECTS = {mine!r}\n" + SYSTEM_V_REMOVE)


# Four memfds of 40 MiB: each stays under RLIMIT_FSIZE (max_file_bytes), which caps a memfd as a file.
MEMFD = textwrap.dedent("""
    import os
    chunk, held = b"x" * (1 << 20), []
    for _ in range(4):
        held.append(os.memfd_create("held"))
        for _ in range(40):
            os.write(held[-1], chunk)
    print("held", sum(os.fstat(descriptor).st_size for descriptor in held) >> 20, "MiB")
""")


def test_memory_held_in_a_memfd_past_the_limit_is_refused(stand_in):
    """A memfd's pages are neither resident nor address space: 160 MiB would pass a 64 MiB limit unseen."""
    assert stand_in.run_plain(MEMFD)["stdout"] == "held 160 MiB\n"
    result = stand_in.run(MEMFD, memory_bytes=64 << 20, max_file_bytes=64 << 20)
    assert "PermissionError" in result["stderr"] and result["exit_code"] == 1 and "held" not in result["stdout"]
    secret = outcomes(stand_in.run(ATTEMPTS + "attempt('memfd_secret', lambda: syscall(447, 0))\n"
                                              "print(json.dumps(results))"))
    assert secret == {"memfd_secret": "EPERM"}


def held_escapes(stand_in) -> dict[str, tuple[str, str]]:
    """Each escape the filter and Landlock hold: (code, errno inside). The trainer's pid is the target."""
    pid, secret_file = stand_in.pid, str(stand_in.secret_file)
    return {
        # PTRACE_SEIZE attaches without stopping the trainer; the tracer's exit detaches it.
        "ptrace of the trainer": (f"syscall(101, 0x4206, {pid}, 0, 0)", "EPERM"),
        "process_vm_readv of the trainer": (textwrap.dedent(f"""
            try:
                address = int(open("/proc/{pid}/maps").readline().split("-")[0], 16)
            except OSError:
                address = 0x400000
            buffer = ctypes.create_string_buffer(8)
            local = struct.pack("=QQ", ctypes.addressof(buffer), 8)
            remote = struct.pack("=QQ", address, 8)
            one, none = ctypes.c_ulong(1), ctypes.c_ulong(0)  # unsigned long: no stray high bits
            syscall(310, {pid}, ctypes.c_char_p(local), one, ctypes.c_char_p(remote), one, none)"""), "EPERM"),
        "io_uring": ("syscall(425, 4, ctypes.create_string_buffer(120))", "EPERM"),
        "pidfd_getfd of the trainer's stdin": (f"syscall(438, os.pidfd_open({pid}), 0, 0)", "EPERM"),
        "pidfd_send_signal to the trainer": (f"syscall(424, os.pidfd_open({pid}), 0, None, 0)", "EPERM"),
        "a file in /dev/shm": ("name = f'/dev/shm/alignflow-escape-{os.getpid()}'\n"
                               "open(name, 'w').write('x'); os.unlink(name)", "EACCES"),
        "a symlink to the trainer's Secret": (f"import tempfile\nlink = os.path.join(tempfile.mkdtemp(), 'link')\n"
                                              f"os.symlink({secret_file!r}, link)\n"
                                              f"assert open(link).read() == {SECRET!r}", "EACCES"),
        "inotify on the output folder": (f"syscall(254, syscall(294, 0), {str(stand_in.output_dir).encode()!r}, "
                                         "0x100)", "EPERM"),
    }


@pytest.mark.parametrize("escape", ["ptrace of the trainer", "process_vm_readv of the trainer", "io_uring",
                                    "pidfd_getfd of the trainer's stdin", "pidfd_send_signal to the trainer",
                                    "a file in /dev/shm", "a symlink to the trainer's Secret",
                                    "inotify on the output folder"])
def test_an_escape_held_today_stays_held(stand_in, escape):
    if os.uname().machine != "x86_64":
        pytest.skip("the syscall numbers in this test are x86_64's")
    action, refused = held_escapes(stand_in)[escape]
    code = ATTEMPTS + f"def action():\n{textwrap.indent(action, '    ')}\nattempt('escape', action)\n" \
                      "print(json.dumps(results))"
    assert outcomes(stand_in.run_plain(code)) == {"escape": "ok"}
    assert outcomes(stand_in.run(code)) == {"escape": refused}
    assert stand_in.process.poll() is None
