"""Each escape the issue lists, tried from inside the sandbox as the trainer image's uid, and shown contained.

Where it is safe, the same code also runs without the sandbox as the same process (the control), which
shows the escape would have worked: the planted credentials are readable, the loopback servers answer.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import textwrap
import time

import pytest

from tests.trainer.sandbox.conftest import SECRET, SERVICE_ACCOUNT_TOKEN
from tests.trainer.sandbox.kernel import skip_without_the_local_sandbox
from trainer.sandbox import SandboxLimits, SandboxUnavailableError, check_sandbox, run_python
from trainer.sandbox.local import ENVIRONMENT_PASSED, sandbox_environment


def alive(pid: int) -> bool:
    return os.path.exists(f"/proc/{pid}")


def test_a_normal_program_prints_computes_and_keeps_files_in_its_scratch_folder(stand_in):
    code = textwrap.dedent("""
        import json, math, os, sys
        with open("notes.txt", "w") as notes:
            notes.write("kept")
        print(sum(i * i for i in range(1000)), math.factorial(20), open("notes.txt").read())
        print("a warning", file=sys.stderr)
    """)
    result = stand_in.run(code)
    assert result["stdout"] == f"{sum(i * i for i in range(1000))} {2432902008176640000} kept\n"
    assert result["stderr"] == "a warning\n"
    assert (result["exit_code"], result["timed_out"], result["truncated"]) == (0, False, False)


def test_an_exception_is_the_programs_own_failure(stand_in):
    result = stand_in.run("raise ValueError('bad input')")
    assert result["exit_code"] == 1 and "ValueError: bad input" in result["stderr"]


@pytest.fixture
def tcp_server():
    server = socket.create_server(("127.0.0.1", 0))
    yield server
    server.close()


def test_no_tcp_connect_out(stand_in, tcp_server):
    port = tcp_server.getsockname()[1]
    code = f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2); print('connected')"
    assert stand_in.run_plain(code)["stdout"] == "connected\n"
    tcp_server.accept()[0].close()
    result = stand_in.run(code)
    assert "PermissionError" in result["stderr"] and "connected" not in result["stdout"]


def test_no_udp_datagram_out(stand_in):
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as server:
        server.bind(("127.0.0.1", 0))
        server.settimeout(0.5)
        port = server.getsockname()[1]
        code = f"import socket; socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'leak', ('127.0.0.1', {port}))"
        assert stand_in.run_plain(code)["exit_code"] == 0
        assert server.recv(16) == b"leak"
        result = stand_in.run(code)
        assert "PermissionError" in result["stderr"]
        with pytest.raises(TimeoutError):
            server.recv(16)


def test_no_credentials_in_the_environment_or_the_trainers_proc_files(stand_in):
    code = textwrap.dedent(f"""
        import os
        print(sorted(os.environ))
        print(any("{SECRET}" in value for value in os.environ.values()))
        for path in ("/proc/{stand_in.pid}/environ", "/proc/1/environ", "/proc/self/environ"):
            try:
                print("{SECRET}" in open(path, errors="replace").read())
            except OSError as err:
                print(type(err).__name__)
    """)
    plain = stand_in.run_plain(code)["stdout"].splitlines()
    assert "AWS_SECRET_ACCESS_KEY" in plain[0] and plain[1] == "True"
    names, leaked, *proc = stand_in.run(code)["stdout"].splitlines()
    # the fixed minimum (no secret among it) and, where set, TZ; Python itself may add LC_CTYPE
    assert set(eval(names)) <= {*sandbox_environment("/scratch"), *ENVIRONMENT_PASSED, "LC_CTYPE"}
    assert leaked == "False"
    assert proc == ["PermissionError"] * 3


def test_no_secret_files(stand_in):
    code = textwrap.dedent(f"""
        import os
        for path in ("{stand_in.secret_file}", "/var/run/secrets/kubernetes.io/serviceaccount/token"):
            try:
                print(open(path).read())
            except OSError as err:
                print(type(err).__name__)
        try:
            print(os.listdir("{stand_in.secret_file.parent}"))
        except OSError as err:
            print(type(err).__name__)
    """)
    plain = stand_in.run_plain(code)["stdout"].splitlines()
    assert plain[0] == SECRET
    secret, token, listing = stand_in.run(code)["stdout"].splitlines()
    # Landlock refuses the open, not the lookup: a token that is absent (on the host) shows as absent
    assert (secret, listing) == ("PermissionError", "PermissionError") and token in ("PermissionError",
                                                                                       "FileNotFoundError")
    if stand_in.image is not None:  # in the image's pod the kubelet's token is there, readable by the trainer
        assert plain[1] == SERVICE_ACCOUNT_TOKEN and token == "PermissionError"


def test_no_writes_outside_the_scratch_folder(stand_in):
    target = stand_in.output_dir / "model.safetensors"
    seen = [str(target), str(stand_in.base / "tmp" / "planted"), "/tmp/alignflow-escape-planted"]  # as the trainer sees them
    planted = [stand_in.host_path(path) for path in seen]
    code = textwrap.dedent(f"""
        import os, tempfile
        for path in {seen}:
            try:
                open(path, "w").write("overwritten")
                print("wrote", path)
            except OSError as err:
                print(type(err).__name__)
        print(os.path.dirname(tempfile.mkstemp()[1]) == os.getcwd())
    """)
    assert stand_in.run_plain(code)["stdout"].startswith("wrote")
    for path in planted:
        path.unlink()
    assert stand_in.run(code)["stdout"].splitlines() == ["PermissionError"] * 3 + ["True"]
    assert not any(path.exists() for path in planted)


def test_no_signals_to_the_trainer(stand_in):
    result = stand_in.run(f"import os, signal; os.kill({stand_in.pid}, signal.SIGKILL)")
    assert "PermissionError" in result["stderr"]
    assert stand_in.process.poll() is None


def test_a_fork_bomb_is_capped_and_leaves_nothing(stand_in):
    code = textwrap.dedent("""
        import json, os, time
        children = []
        while True:
            try:
                pid = os.fork()
            except OSError:
                break
            if pid == 0:
                time.sleep(600)
                os._exit(0)
            children.append(pid)
        print(json.dumps(children))
    """)
    result = stand_in.run(code, max_processes=8, wall_seconds=10)
    children = json.loads(result["stdout"])
    assert 0 < len(children) <= 8 and result["exit_code"] == 0
    assert result["seconds"] < 8  # the fork failed at the cap instead of running into the wall clock
    assert not any(map(alive, children))


def test_allocating_10_gb_fails_inside(stand_in):
    result = stand_in.run("big = bytearray(10 * 2**30)", memory_bytes=512 << 20)
    assert "MemoryError" in result["stderr"] and result["exit_code"] == 1


def test_memory_held_across_processes_is_capped_too(stand_in):
    """Each process stays under its RLIMIT_AS; together they pass memory_bytes, and the run is stopped."""
    code = textwrap.dedent("""
        import os, time
        for _ in range(4):
            if os.fork() == 0:
                block = b"x" * (60 << 20)
                time.sleep(60)
        time.sleep(60)
    """)
    result = stand_in.run(code, memory_bytes=128 << 20, wall_seconds=30)
    assert result["memory_exceeded"] and result["exit_code"] is None and not result["timed_out"]
    assert result["seconds"] < 20


def test_printing_1_gb_is_cut_and_stopped_early(stand_in):
    code = "import sys\nline = 'x' * (1 << 20)\nfor _ in range(1024):\n    sys.stdout.write(line)"
    result = stand_in.run(code, max_output_bytes=1 << 20, wall_seconds=20)
    assert result["truncated"] and result["exit_code"] is None
    assert len(result["stdout"]) == 1 << 20
    assert result["seconds"] < 10


def test_sleeping_forever_times_out(stand_in):
    result = stand_in.run("import time\nprint('started', flush=True)\ntime.sleep(10**6)", wall_seconds=1)
    assert result["timed_out"] and result["exit_code"] is None and result["stdout"] == "started\n"
    assert 1 <= result["seconds"] < 6


def test_burning_cpu_is_stopped_by_the_cpu_limit(stand_in):
    result = stand_in.run("while True:\n    pass", cpu_seconds=1, wall_seconds=20)
    assert result["exit_code"] == -signal.SIGXCPU and not result["timed_out"]


DAEMON = textwrap.dedent("""
    import os, sys, time
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            print(os.getpid(), flush=True)
            while True:
                time.sleep(0.1)
        os._exit(0)
    time.sleep(0.5)
""")


@pytest.mark.parametrize("ending", ["timeout", "normal exit"])
def test_a_double_forked_setsid_child_does_not_outlive_the_run(stand_in, ending):
    code = DAEMON + ("time.sleep(10**6)\n" if ending == "timeout" else "")
    result = stand_in.run(code, wall_seconds=1)
    daemon = int(result["stdout"])
    assert result["timed_out"] == (ending == "timeout")
    assert not alive(daemon)


def test_killing_one_runs_tree_spares_another_run_beside_it(stand_in):
    """Each run's supervisor kills within its own Landlock domain: a timeout next door touches nothing here."""
    patient = "import time\ntime.sleep(2.5)\nprint('finished')"
    stuck = DAEMON + "time.sleep(10**6)\n"
    finished, killed = stand_in.run_together((patient, {"wall_seconds": 20}), (stuck, {"wall_seconds": 1}))
    assert finished["stdout"] == "finished\n" and finished["exit_code"] == 0
    assert killed["timed_out"] and not alive(int(killed["stdout"]))


def test_check_sandbox_passes_here(stand_in):
    assert stand_in.check() == {"ok": True}


@pytest.mark.parametrize(("denied", "errno", "named"), [
    (444, 38, "Landlock unavailable: the kernel has no Landlock (ENOSYS)"),  # landlock_create_ruleset
    (317, 38, "seccomp filter could not be installed"),  # seccomp(2) on x86_64
])
def test_a_missing_mechanism_is_named_at_start_up(stand_in, denied, errno, named):
    if os.uname().machine != "x86_64":
        pytest.skip("the syscall numbers in this test are x86_64's")
    outcome = stand_in.check({denied: errno})
    assert named in outcome["error"] and outcome["error"].startswith("sandbox cannot start")


def test_as_root_the_program_runs_as_nobody(tmp_path):
    """Root's trainer: the program runs as uid 65534 with a Python that uid can reach (this one, or python3)."""
    if os.geteuid() != 0:
        pytest.skip("only a root trainer drops the program to uid 65534")
    skip_without_the_local_sandbox()
    try:
        check_sandbox()
    except SandboxUnavailableError as err:
        pytest.skip(f"no interpreter uid 65534 can run here: {err}")
    code = f"import os\nprint(os.getuid())\nopen('{tmp_path}/x', 'w')"
    result = run_python(code, limits=SandboxLimits(wall_seconds=10))
    assert result.stdout == "65534\n" and "PermissionError" in result.stderr


def test_without_pidfd_open_the_supervisor_polls_and_still_holds(stand_in):
    """An older container profile may refuse pidfd_open (434 on x86_64 and aarch64): the canary still passes."""
    assert stand_in.check({434: 1}) == {"ok": True}


def test_the_runs_tree_dies_with_the_trainer(stand_in, tmp_path):
    """A trainer killed mid-run (a preempted pod, kill -9): its supervisor notices and kills the tree."""
    from tests.trainer.sandbox.conftest import launch_as_trainer

    code = DAEMON.replace("print(os.getpid(), flush=True)", "open('daemon.pid', 'w').write(str(os.getpid()))")
    trainer, scratch_root = launch_as_trainer(stand_in, code + "time.sleep(10**6)\n")
    try:
        pid_files = []
        for _ in range(200):
            pid_files = list(scratch_root.glob("alignflow-sandbox-*/daemon.pid"))
            if pid_files and pid_files[0].read_text():
                break
            time.sleep(0.05)
        daemon = int(pid_files[0].read_text())
        assert alive(daemon)
    finally:
        trainer.kill()
        trainer.wait()
    for _ in range(100):
        if not alive(daemon):
            break
        time.sleep(0.05)
    assert not alive(daemon)
