"""The sandbox's supervisor: `python -I -S _supervisor.py` reads a request on stdin, answers on stdout.

Request and answer are `marshal`ed dicts (the trainer starts this file with its own interpreter, and marshal
loads in a millisecond where json's imports take tens). Standard library only, run with a clean
environment in a fresh scratch folder (its working directory) and in a new session, by
`trainer.sandbox.local`. It

1. becomes a child subreaper (orphans of the tree it starts are reparented to it, so it reaps them) and
   enters a Landlock domain of its own that only *scopes* (no filesystem rules): from then on it can
   signal nothing outside that domain, which it checks by failing to signal its parent;
2. forks the program's process, which sets its rlimits, drops root to uid 65534 when run as root, enters a
   nested Landlock domain (filesystem: read and execute only beneath the interpreter's folders, everything
   beneath the scratch folder; no TCP; no signals or abstract sockets outside) and the seccomp filter, and
   executes the interpreter on `main.py`;
3. collects stdout and stderr up to the output limit and waits up to the wall-clock limit, while the run's
   processes together hold at most `memory_bytes` (with their files, where the scratch folder is a tmpfs),
   while its files take at most `max_scratch_bytes` (`_usage.py` measures both), and while the trainer
   lives;
4. then `kill(-1, SIGKILL)`: inside its own domain that reaches exactly the processes of the nested one,
   the program's whole tree, whatever sessions or process groups they made, and nothing else (the kernel
   checks the domain; the fork of a process already sent SIGKILL fails, so none slips through), reaps
   them, and answers.

A failure before the program starts is answered as `{"setup_error": "..."}` naming the mechanism."""

from __future__ import annotations

import marshal
import os
import resource
import select
import sys
import time


def _load_sibling(name: str):
    """Import the file `name`.py next to this one, without putting this folder on sys.path (where the
    package's other modules would shadow the standard library's) and without importlib's imports."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py")
    module = type(sys)(name)
    module.__file__ = path
    with open(path, "rb") as source:
        exec(compile(source.read(), path, "exec"), module.__dict__)
    return module


_landlock = _load_sibling("_landlock")
_seccomp = _load_sibling("_seccomp")
_usage = _load_sibling("_usage")

PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER = 1, 36
SIGKILL = 9  # Linux's, on every architecture (the signal module would import enum: 50 ms)
NOBODY = 65534
DEVICE_FILES = ("/dev/null", "/dev/zero", "/dev/urandom")
CHUNK = 1 << 16
# How often the supervisor checks the run's total memory, its files and its parent: overshoot and reaction
# time, against the supervisor's own CPU (a few /proc reads per process and a walk of the scratch folder).
POLL_SECONDS = 0.1
# Runs main.py as `python main.py` would, but its tracebacks say `main.py`, not the random scratch path, so
# the same program prints the same thing every run (the environment fixes PYTHONHASHSEED for the same reason).
BOOTSTRAP = """\
import sys
sys.argv[0] = "main.py"
namespace = {"__name__": "__main__", "__file__": "main.py", "__builtins__": __builtins__}
try:
    with open("main.py", "rb") as source:
        code = compile(source.read(), "main.py", "exec")
    exec(code, namespace)
except SystemExit:
    raise
except BaseException as error:
    import traceback
    traceback.print_exception(type(error), error, error.__traceback__.tb_next)
    sys.exit(1)
"""


def _prctl(option: int, value: int) -> None:
    import ctypes

    if ctypes.CDLL(None, use_errno=True).prctl(option, ctypes.c_ulong(value), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({option}) failed")


def count_tasks(uid: int) -> int:
    """Threads and processes of `uid` visible here: what RLIMIT_NPROC counts (the kernel counts the uid's
    tasks outside this PID namespace too, so the real headroom can only be smaller)."""
    count = 0
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.stat(f"/proc/{name}").st_uid == uid:
                    count += len(os.listdir(f"/proc/{name}/task"))
            except OSError:
                continue  # the process ended meanwhile
    return count


def _within_hard_limit(limit: int, wanted: tuple[int, int]) -> tuple[int, int]:
    """`wanted`, lowered to the hard limit the pod already has (raising it would need privileges)."""
    _, hard = resource.getrlimit(limit)
    if hard == resource.RLIM_INFINITY:
        return wanted
    return min(wanted[0], hard), min(wanted[1], hard)


def confine_program(request: dict, step: list[str]) -> None:
    """In the forked child: limits, identity, Landlock, seccomp, then exec the program (never returns).

    `step` gets the name of the mechanism being set up, for the error message when one fails."""
    limits, scratch = request["limits"], os.getcwd()
    step[0] = "dropping root to uid 65534"
    if os.geteuid() == 0:  # root ignores RLIMIT_NPROC and holds capabilities: run as nobody instead
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)
    uid = os.getuid()
    step[0] = "prctl(PR_SET_PDEATHSIG)"
    _prctl(PR_SET_PDEATHSIG, SIGKILL)  # should the supervisor be killed, the program goes too
    step[0] = "setrlimit"
    for limit, value in ((resource.RLIMIT_CPU, (limits["cpu_seconds"], limits["cpu_seconds"] + 1)),
                         (resource.RLIMIT_AS, (limits["memory_bytes"],) * 2),
                         (resource.RLIMIT_NPROC, (count_tasks(uid) + limits["max_processes"],) * 2),
                         (resource.RLIMIT_FSIZE, (limits["max_file_bytes"],) * 2),
                         (resource.RLIMIT_NOFILE, (256, 256)), (resource.RLIMIT_CORE, (0, 0))):
        resource.setrlimit(limit, _within_hard_limit(limit, value))
    step[0] = "Landlock"
    _landlock.restrict_self(read_paths=request["read_paths"], write_paths=[scratch],
                            device_files=[path for path in DEVICE_FILES if os.path.exists(path)])
    step[0] = "seccomp"
    _seccomp.install_filter(_seccomp.build_filter())
    step[0] = f"exec {request['interpreter']}"
    # -S -s: no site-packages (the environment is ours, so no -E); the scratch folder is first on sys.path, as
    # the script's folder is for `python main.py`.
    os.execve(request["interpreter"], [request["interpreter"], "-S", "-s", "-c", BOOTSTRAP],
              request["environment"])


def start_program(request: dict) -> tuple[int, int, int]:
    """Fork the confined program; returns (pid, stdout fd, stderr fd), or raises with the setup error."""
    out_read, out_write = os.pipe()
    err_read, err_write = os.pipe()
    error_read, error_write = os.pipe()  # close-on-exec: EOF means the exec happened
    if os.geteuid() == 0:
        os.chown(os.getcwd(), NOBODY, NOBODY)
    pid, step = os.fork(), ["fork"]
    if pid == 0:
        try:
            os.close(out_read), os.close(err_read), os.close(error_read)
            null = os.open("/dev/null", os.O_RDONLY)
            os.dup2(null, 0), os.dup2(out_write, 1), os.dup2(err_write, 2)
            os.closerange(3, error_write)
            os.closerange(error_write + 1, 1 << 16)
            confine_program(request, step)
        except BaseException as err:  # noqa: BLE001  (anything at all: report it, never run unconfined)
            detail = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
            os.write(error_write, f"{step[0]}: {detail}".encode())
        finally:
            os._exit(127)
    os.close(out_write), os.close(err_write), os.close(error_write)
    error = b"".join(iter(lambda: os.read(error_read, CHUNK), b""))
    os.close(error_read)
    if error:
        os.waitpid(pid, 0)
        raise RuntimeError(error.decode(errors="replace"))
    return pid, out_read, err_read


def collect(pid: int, pipes: dict[int, bytearray], request: dict) -> dict:
    """Read the pipes until the program exits, the deadline passes, the output outgrows its limit, the
    processes together hold more than `memory_bytes` (counting their files too where the scratch folder is
    memory), the files outgrow `max_scratch_bytes`, or the trainer is gone (this process was reparented:
    nobody waits for the answer any more)."""
    limits, scratch = request["limits"], os.getcwd()
    deadline, pidfd, parent = time.monotonic() + limits["wall_seconds"], _open_pidfd(pid), os.getppid()
    open_pipes = set(pipes)
    outcome = {"timed_out": False, "truncated": False, "memory_exceeded": False, "scratch_exceeded": False}
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or os.getppid() != parent:
            outcome["timed_out"] = True
            break
        watched = [*open_pipes] + ([pidfd] if pidfd is not None else [])
        ready, _, _ = select.select(watched, [], [], min(remaining, POLL_SECONDS))
        for descriptor in ready:
            if descriptor != pidfd:
                chunk = os.read(descriptor, CHUNK)
                pipes[descriptor] += chunk
                if not chunk:
                    open_pipes.discard(descriptor)
        if sum(map(len, pipes.values())) > limits["max_output_bytes"]:
            outcome["truncated"] = True
            break
        if pidfd in ready or pidfd is None and _has_exited(pid):
            break
        processes = _usage.run_processes(os.getpid())
        files = _usage.file_bytes(scratch, processes)
        if files > limits["max_scratch_bytes"]:
            outcome["scratch_exceeded"] = True
            break
        in_memory = files if request["scratch_in_memory"] else 0
        if _usage.resident_bytes(processes) + in_memory > limits["memory_bytes"]:
            outcome["memory_exceeded"] = True
            break
    if pidfd is not None:
        os.close(pidfd)
    return outcome


def _open_pidfd(pid: int) -> int | None:
    """A descriptor that becomes readable when `pid` exits; None where the kernel or profile has no pidfd_open."""
    try:
        return os.pidfd_open(pid)
    except OSError:
        return None


def _has_exited(pid: int) -> bool:
    """Whether `pid` has exited, leaving it to be reaped (and its status read) later."""
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def stop_everything(pid: int) -> int | None:
    """SIGKILL every process of the nested domain, reap every child; returns the program's wait status."""
    status = None
    for _ in range(2):
        try:
            os.kill(-1, SIGKILL)  # scoped by Landlock: only the program's tree
        except ProcessLookupError:
            pass  # nothing left to signal
    while True:
        try:
            reaped, wait_status = os.waitpid(-1, 0)
        except ChildProcessError:
            return status
        if reaped == pid:
            status = wait_status


def drain(pipes: dict[int, bytearray], limit: int) -> None:
    """Read what the killed writers left in the pipes (every writer is gone, so each read ends)."""
    for descriptor, data in pipes.items():
        while sum(map(len, pipes.values())) <= limit and (chunk := os.read(descriptor, CHUNK)):
            data += chunk
        os.close(descriptor)


def enter_supervisor_domain() -> None:
    """Become the subreaper of the program's tree and enter the scoping-only domain, then prove the scope."""
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    _landlock.restrict_self(handle_fs=False, handle_tcp=False)
    try:
        os.kill(os.getppid(), 0)
    except PermissionError:
        return
    raise RuntimeError("Landlock signal scoping does not hold: the supervisor could still signal its parent")


def main() -> None:
    """Read the request, run the program confined, answer with its result (or the setup error)."""
    request = marshal.loads(sys.stdin.buffer.read())
    limits = request["limits"]
    try:
        enter_supervisor_domain()
        pid, out, err = start_program(request)
    except Exception as error:  # noqa: BLE001  (one line naming what failed)
        detail = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
        sys.stdout.buffer.write(marshal.dumps({"setup_error": detail}))
        return
    pipes = {out: bytearray(), err: bytearray()}
    outcome = collect(pid, pipes, request)
    status = stop_everything(pid)
    drain(pipes, limits["max_output_bytes"])
    stopped = any(outcome.values())
    exit_code = None if stopped or status is None else os.waitstatus_to_exitcode(status)
    output, budget = [], limits["max_output_bytes"]
    for data in pipes.values():
        output.append(bytes(data[:budget]).decode(errors="replace"))
        outcome["truncated"] |= len(data) > budget
        budget = max(0, budget - len(data))
    try:
        sys.stdout.buffer.write(marshal.dumps({"stdout": output[0], "stderr": output[1], "exit_code": exit_code,
                                               **outcome}))
        sys.stdout.flush()
    except BrokenPipeError:
        pass  # the trainer is gone; its tree is dead all the same


if __name__ == "__main__":
    main()
