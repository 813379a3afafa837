"""Stands for the trainer process in the escape tests: runs as the image's uid with planted credentials.

`python trainer_stand_in.py` reads one JSON request per line on stdin and answers one JSON line:
- `{"code": ..., "limits": {...}}`: `run_python` (the sandbox), answered with the result and its seconds;
  with `"scratch_root": path`, the scratch folder is made there instead of in `TMPDIR`;
- `{"code": ..., "plain": true}`: the same code in a plain subprocess with this process's environment and
  rights, to show that each escape works without the sandbox (so the tests can fail);
- `{"concurrent": [request, ...]}`: those requests at once, from threads, answered as a list;
- `{"check": true, "profile_denials": {"444": 38}}`: `check_sandbox()` in a forked child that first
  installs a seccomp filter refusing those syscalls, standing for a container profile or kernel that
  lacks a mechanism.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time


def answer(request: dict) -> dict:
    from trainer.sandbox import SandboxError, SandboxLimits, run_python

    if request.get("plain"):
        done = subprocess.run([sys.executable, "-c", request["code"]], capture_output=True, text=True, timeout=30)
        return {"stdout": done.stdout, "stderr": done.stderr, "exit_code": done.returncode}
    if "concurrent" in request:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(len(request["concurrent"])) as pool:
            return {"answers": list(pool.map(answer, request["concurrent"]))}
    if request.get("check"):
        return check_under_profile({int(k): v for k, v in request.get("profile_denials", {}).items()})
    started, tempfile.tempdir = time.monotonic(), request.get("scratch_root")  # None: TMPDIR again
    try:
        result = run_python(request["code"], limits=SandboxLimits(**request.get("limits", {})))
    except SandboxError as err:
        return {"error": str(err)}
    finally:
        tempfile.tempdir = None
    return {**result.to_dict(), "seconds": time.monotonic() - started}


def check_under_profile(denials: dict[int, int]) -> dict:
    """check_sandbox() in a child whose own seccomp filter refuses `denials` (number: errno)."""
    from trainer.sandbox import SandboxError, _landlock, _seccomp, check_sandbox

    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        outcome = {"ok": True}
        try:
            _landlock.set_no_new_privs()
            _seccomp.install_filter(_seccomp.build_filter(extra_denials=denials))
            check_sandbox()
        except SandboxError as err:
            outcome = {"error": str(err)}
        os.write(write_end, json.dumps(outcome).encode())
        os._exit(0)
    os.close(write_end)
    data = b"".join(iter(lambda: os.read(read_end, 1 << 16), b""))
    os.waitpid(pid, 0)
    return json.loads(data)


def main() -> None:
    for line in sys.stdin:
        print(json.dumps(answer(json.loads(line))), flush=True)


if __name__ == "__main__":
    main()
