"""Real services for integration tests, started on loopback: a moto S3 server and an MLflow server."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

BIN = Path(sys.executable).parent
S3_ENV = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until_up(url: str, process: subprocess.Popen, timeout: float, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{url}: server exited with {process.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.3)
    process.kill()
    raise RuntimeError(f"{url}: not up after {timeout:.0f} s:\n{log.read_text()[-3000:]}")


def start_moto(log_dir: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    log = log_dir / "moto.log"
    process = subprocess.Popen([str(BIN / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
                               stdout=log.open("w"), stderr=subprocess.STDOUT)
    endpoint = f"http://127.0.0.1:{port}"
    wait_until_up(f"{endpoint}/moto-api/", process, 30, log)
    return process, endpoint


def start_mlflow(log_dir: Path, artifacts: str, extra_env: dict[str, str],
                 extra_args: tuple[str, ...] = ()) -> tuple[subprocess.Popen, str]:
    """`mlflow server` with a sqlite backend, artifacts proxied to `artifacts`, one worker (and `extra_args`, such
    as `--enable-workspaces`)."""
    port = free_port()
    log = log_dir / f"mlflow-{port}.log"
    command = [str(BIN / "mlflow"), "server", "--backend-store-uri", f"sqlite:///{log_dir}/mlflow-{port}.db",
               "--artifacts-destination", artifacts, "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
               *extra_args]
    # Without MLflow's job runner, as the chart runs it (a runner and seven consumer processes, 16 s of CPU).
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", **extra_env}
    process = subprocess.Popen(command, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env)
    uri = f"http://127.0.0.1:{port}"
    wait_until_up(f"{uri}/health", process, 120, log)
    return process, uri


def stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
