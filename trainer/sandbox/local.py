"""Run untrusted Python on this machine: Landlock, seccomp and rlimits, in a fresh scratch folder.

`run_python` writes the program into a new scratch folder and starts the supervisor (`_supervisor.py`,
`python -I -S`, a clean environment, a new session), which confines, runs, limits and kills the program
and answers. What is readable inside: the interpreter and the system's library folders
(`readable_paths`), never the trainer's Secret folders, `/var/run/secrets`, `/proc` or the output folder.
`check_sandbox` runs a canary that tries the escapes from inside and raises when one is not contained.
See docs/sandbox.md for what this protects and what it does not.
"""

from __future__ import annotations

import json
import marshal
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

from trainer.sandbox.contract import SandboxError, SandboxLimits, SandboxResult, SandboxUnavailableError
from trainer.secret_keys import SECRET_DIRS_VARIABLE

SUPERVISOR = Path(__file__).with_name("_supervisor.py")
# System folders the interpreter and its shared libraries live in (merged-/usr systems link the others in).
SYSTEM_READ_PATHS = ("/usr", "/lib", "/lib64", "/bin", "/etc/ld.so.cache", "/etc/localtime")
# Where Kubernetes mounts service-account tokens and Secrets: never readable inside.
SECRET_MOUNTS = ("/var/run/secrets", "/run/secrets")
ENVIRONMENT_PASSED = ("TZ",)  # inherited variables the program may see; nothing else crosses over
SYSTEM_PYTHONS = ("/usr/bin/python3", "/usr/local/bin/python3")
SUPERVISOR_GRACE_SECONDS = 30  # beyond wall_seconds, before the supervisor itself is presumed stuck


def readable_paths(interpreter: str, environ: dict[str, str] | None = None) -> list[str]:
    """Folders and files the sandboxed interpreter may read and execute, checked against the Secret folders.

    Raises:
        SandboxUnavailableError: A Secret folder (`ALIGNFLOW_SECRET_ENV_DIRS`, /var/run/secrets) lies
            beneath one of them.
    """
    environ = os.environ if environ is None else environ
    executable = os.path.realpath(interpreter)
    if executable == os.path.realpath(sys.executable):
        stdlib = sysconfig.get_path("stdlib", vars={"installed_base": sys.base_prefix})
        dynload = os.path.join(sysconfig.get_path("platstdlib", vars={"platbase": sys.base_exec_prefix}),
                               "lib-dynload")
        libpython = os.path.join(sysconfig.get_config_var("LIBDIR") or "/", sysconfig.get_config_var("LDLIBRARY") or "")
        interpreter_paths = [stdlib, dynload, libpython]
    else:  # another CPython: its standard library and shared library sit in <prefix>/lib by convention
        interpreter_paths = [os.path.join(os.path.dirname(os.path.dirname(executable)), "lib")]
    candidates = [*SYSTEM_READ_PATHS, executable, *interpreter_paths]
    paths = sorted({os.path.realpath(path) for path in candidates if os.path.exists(path)})
    secrets = [*SECRET_MOUNTS, *filter(None, environ.get(SECRET_DIRS_VARIABLE, "").split(":"))]
    for secret in secrets:
        secret_real = os.path.realpath(secret)
        for path in paths:
            if secret_real == path or secret_real.startswith(path.rstrip("/") + "/"):
                raise SandboxUnavailableError(
                    f"sandbox: the Secret folder {secret} lies beneath {path}, which the sandboxed interpreter "
                    f"must read; move the Secret (or {SECRET_DIRS_VARIABLE}) out of it")
    return paths


def default_interpreter() -> str:
    """This Python; but when root runs the trainer (the program then runs as uid 65534) and this Python lies
    where other users cannot reach it (a pyenv under /root), the system's python3, if one is reachable."""
    if os.geteuid() != 0 or _reachable_by_others(sys.executable):
        return sys.executable
    return next((path for path in SYSTEM_PYTHONS if _reachable_by_others(path)), sys.executable)


def _reachable_by_others(path: str) -> bool:
    """Whether a user who is neither owner nor group may execute `path` (every folder on the way searchable)."""
    real = Path(os.path.realpath(path))
    try:
        return all(folder.stat().st_mode & stat.S_IXOTH for folder in [real, *real.parents])
    except OSError:
        return False


def sandbox_environment(scratch: str) -> dict[str, str]:
    """The program's whole environment: a fixed minimum plus `ENVIRONMENT_PASSED`; no credentials."""
    environment = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": scratch, "TMPDIR": scratch, "LANG": "C.UTF-8",
                   "LC_ALL": "C.UTF-8", "PYTHONIOENCODING": "utf-8", "PYTHONHASHSEED": "0",
                   "PYTHONDONTWRITEBYTECODE": "1"}
    environment.update({name: os.environ[name] for name in ENVIRONMENT_PASSED if name in os.environ})
    return environment


def run_python(code: str, *, limits: SandboxLimits | None = None, interpreter: str | None = None) -> SandboxResult:
    """Run `code` as a Python program in the sandbox and return what it printed and how it ended.

    Args:
        code: The program's source.
        limits: Time, memory, process and output limits (default: `SandboxLimits()`).
        interpreter: The Python that runs the program (default: `default_interpreter()`). It runs with
            `-S -s`, so only its standard library is importable.

    Raises:
        SandboxUnavailableError: A mechanism the sandbox needs is missing here; the message names it.
        SandboxError: The supervisor itself failed or hung.
    """
    limits = limits or SandboxLimits()
    interpreter = interpreter or default_interpreter()
    scratch = tempfile.mkdtemp(prefix="alignflow-sandbox-")
    try:
        Path(scratch, "main.py").write_text(code, encoding="utf-8")
        request = {"limits": limits.model_dump(), "read_paths": readable_paths(interpreter),
                   "interpreter": os.path.realpath(interpreter), "environment": sandbox_environment(scratch),
                   "scratch_in_memory": in_memory(scratch)}
        answer = _supervise(scratch, request, limits.wall_seconds + SUPERVISOR_GRACE_SECONDS)
    finally:
        _remove_scratch(scratch)
    if "setup_error" in answer:
        raise SandboxUnavailableError(f"sandbox cannot start: {answer['setup_error']}")
    return SandboxResult(**answer)


# Filesystems whose files are pages of memory: what a run keeps in them counts against `memory_bytes`.
MEMORY_FILESYSTEMS = ("tmpfs", "ramfs")


def in_memory(path: str, mountinfo: str = "/proc/self/mountinfo") -> bool:
    """Whether `path` lies on a filesystem held in memory (a tmpfs `/tmp`, an `emptyDir` with `medium: Memory`):
    the filesystem of the longest (and, among equals, the last: the one on top) mount point above it in
    `mountinfo`. True where that cannot be read, which errs toward counting the files."""
    real, best, best_type = os.path.realpath(path), "", ""
    try:
        with open(mountinfo, encoding="utf-8", errors="replace") as mounts:
            lines = mounts.read().splitlines()
    except OSError:
        return True
    for line in lines:  # "id parent dev root MOUNT-POINT options ... - TYPE source options"
        mount, _, filesystem = line.partition(" - ")
        if len(mount.split()) < 5 or not filesystem:
            continue
        mount_point = _unescape(mount.split()[4])
        if (real == mount_point or real.startswith(mount_point.rstrip("/") + "/")) and len(mount_point) >= len(best):
            best, best_type = mount_point, filesystem.split()[0]
    return best_type in MEMORY_FILESYSTEMS


def _unescape(field: str) -> str:
    """A mountinfo path with its octal escapes (`\\040` for a space) decoded."""
    return re.sub(r"\\([0-7]{3})", lambda match: chr(int(match.group(1), 8)), field)


def _supervise(scratch: str, request: dict, timeout: float) -> dict:
    """Run the supervisor (with this interpreter, whichever runs the program) on `request`; its answer."""
    process = subprocess.Popen([sys.executable, "-I", "-S", str(SUPERVISOR)], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=scratch,
                               env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}, start_new_session=True)
    try:
        stdout, stderr = process.communicate(marshal.dumps(request), timeout=timeout)
    except subprocess.TimeoutExpired as err:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        raise SandboxError(f"sandbox supervisor did not answer within {timeout:.0f} s; its process group was "
                           "killed") from err
    try:
        return marshal.loads(stdout)
    except (EOFError, ValueError, TypeError) as err:
        detail = stderr.decode(errors="replace").strip().splitlines()[-1:] or [f"exit status {process.returncode}"]
        raise SandboxError(f"sandbox supervisor failed: {detail[0]}") from err


def _remove_scratch(scratch: str) -> None:
    """Delete the scratch folder, even where the program took away its own permissions, never following a link.

    The program's entries are its own to shape: a symlink to `/usr` named like a folder must not make a
    root trainer chmod `/usr`. So each folder is opened by descriptor relative to its parent, with
    O_NOFOLLOW (a link is never entered), its mode restored through that descriptor, and `shutil.rmtree`
    (which unlinks links and works by descriptor) removes the rest.
    """
    try:
        top = os.open(scratch, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return  # already gone
    try:
        _open_up_folder(top)
    finally:
        os.close(top)
    shutil.rmtree(scratch, ignore_errors=True)


def _open_up_folder(folder: int, depth: int = 0) -> None:
    """Make the folder open at `folder` (an O_PATH descriptor), and every real folder beneath it, 0700."""
    try:
        os.chmod(f"/proc/self/fd/{folder}", 0o700)  # the descriptor's own inode: no path is looked up again
    except OSError:
        pass  # not ours to fix (root ran the program as nobody, or a foreign mount); rmtree then skips it
    if depth > 128:
        return  # deeper than a path can name: rmtree reports nothing either way
    try:
        readable = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=folder)
    except OSError:
        return
    try:
        with os.scandir(readable) as entries:
            names = [entry.name for entry in entries if entry.is_dir(follow_symlinks=False)]
        for name in names:
            try:
                child = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=folder)
            except OSError:
                continue  # replaced meanwhile, or a link: never entered
            try:
                _open_up_folder(child, depth + 1)
            finally:
                os.close(child)
    finally:
        os.close(readable)


CANARY = """
import json, os, signal, socket
escaped = []
def attempt(name, action):
    try:
        action()
        escaped.append(name)
    except OSError:
        pass
attempt("a UDP socket", lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
attempt("a TCP socket", lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM))
attempt("a write outside the scratch folder", lambda: open(os.path.join(os.path.dirname(os.getcwd()),
        "alignflow-sandbox-canary-" + str(os.getpid())), "x"))
attempt("a signal to the supervisor", lambda: os.kill(os.getppid(), 0))
attempt("a read of /proc", lambda: os.listdir("/proc"))
attempt("a change of mode", lambda: os.chmod(os.getcwd(), 0o700))
attempt("a memfd", lambda: os.memfd_create("canary"))
print(json.dumps(escaped))
"""


def check_sandbox(*, interpreter: str | None = None) -> None:
    """Start the sandbox once and check from inside that it holds; call it once at start-up.

    Raises:
        SandboxUnavailableError: A mechanism is missing (Landlock, seccomp, prctl...), named in the
            message, or an escape the canary tried was not contained.
    """
    result = run_python(CANARY, limits=SandboxLimits(wall_seconds=30), interpreter=interpreter)
    if result.exit_code != 0:
        raise SandboxUnavailableError(f"sandbox canary failed (exit {result.exit_code}): {result.stderr[-500:]}")
    escaped = json.loads(result.stdout)
    if escaped:
        raise SandboxUnavailableError(f"sandbox does not hold here: {', '.join(escaped)} succeeded inside it")
