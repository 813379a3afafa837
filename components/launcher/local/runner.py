"""Run a PyTorchJob manifest on this machine: one local process per replica, as the operator would.

Each replica runs its container's command with the environment the Training Operator injects
(MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK and torchrun's PET_NNODES, PET_NPROC_PER_NODE,
PET_NODE_RANK, PET_MASTER_ADDR, PET_MASTER_PORT), so the command a cluster runs is the command that
runs here. `restartPolicy` and `runPolicy.backoffLimit` are honoured by restarting the whole job;
images, GPU requests, node selectors, security contexts and volumes have no meaning locally and are
ignored (said once). An elastic job (Worker replicas with an elasticPolicy) runs with the same static
rendezvous on 127.0.0.1. Environment values read from Secrets (secretKeyRef) are taken from this
process's environment. Each replica is pinned to its own share of this machine's CPUs, as each pod of
a cluster has its own node: the trainer sizes its thread pool from its affinity, and replicas that
each took every core would contend for them (a 2-replica SFT job of 60 steps on 2 cores: 16-17 s
pinned, 22-23 s not).
"""

from __future__ import annotations

import collections
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from trainer.errors import LaunchError

logger = logging.getLogger(__name__)
TAIL_LINES = 60


@dataclass(slots=True)
class LocalJobResult:
    attempts: int
    log_tail: str


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _replicas(manifest: dict) -> list[tuple[str, int, dict]]:
    """(replica type, node rank, container) for every pod the operator would create.

    Master is rank 0; an elastic job has Workers only, and worker-0 is rank 0 (it hosts the
    rendezvous on a cluster). Locally every job uses torchrun's static rendezvous on this machine.
    """
    specs = manifest["spec"]["pytorchReplicaSpecs"]
    pods, rank = [], 0
    for replica_type in ("Master", "Worker"):
        spec = specs.get(replica_type)
        for _ in range(spec["replicas"] if spec else 0):
            container = next(c for c in spec["template"]["spec"]["containers"] if c["name"] == "pytorch")
            pods.append((replica_type, rank, container))
            rank += 1
    return pods


def _environment(container: dict, rank: int, num_nodes: int, nproc: str, port: int) -> dict[str, str]:
    env = dict(os.environ)
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = item["value"]
            continue
        # A secretKeyRef: locally its value comes from this process's environment, as it is.
        reference = item.get("valueFrom", {}).get("secretKeyRef", {})
        if item["name"] not in os.environ and not reference.get("optional"):
            logger.warning("local mode: %s comes from Secret %s on Kubernetes and is not set here", item["name"],
                           reference.get("name"))
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(num_nodes), RANK=str(rank),
               PET_NNODES=str(num_nodes), PET_NPROC_PER_NODE=nproc, PET_NODE_RANK=str(rank),
               PET_MASTER_ADDR="127.0.0.1", PET_MASTER_PORT=str(port))
    return env


def _cpu_shares(count: int) -> list[set[int] | None]:
    """A disjoint set of this process's CPUs for each of `count` replicas; None (no pinning) for all when
    there are fewer CPUs than replicas."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if count < 2 or len(cpus) < count:
        return [None] * count
    size, extra = divmod(len(cpus), count)
    shares, start = [], 0
    for index in range(count):
        end = start + size + (index < extra)
        shares.append(set(cpus[start:end]))
        start = end
    return shares


def _command(container: dict) -> list[str]:
    command = list(container["command"]) + list(container.get("args", []))
    # The same programs, without relying on PATH: this interpreter runs them.
    if command and command[0] == "torchrun":
        command = [sys.executable, "-m", "torch.distributed.run", *command[1:]]
    elif command and command[0] in ("python", "python3"):
        command = [sys.executable, *command[1:]]
    return command


class _Replica:
    """One running replica: its process, and a thread copying its output to the log and a tail."""

    def __init__(self, label: str, command: list[str], env: dict[str, str], cwd: str | None,
                 log: Callable[[str], None], cpus: set[int] | None = None) -> None:
        self.label = label
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self.process = subprocess.Popen(command, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        text=True, start_new_session=True)
        if cpus is not None:
            # Set from here rather than in a preexec_fn (unsafe with this process's log threads). torchrun forks
            # its workers only after importing torch, seconds later, so they inherit it.
            os.sched_setaffinity(self.process.pid, cpus)
        self.reader = threading.Thread(target=self._pump, args=(log,), daemon=True)
        self.reader.start()

    def _pump(self, log: Callable[[str], None]) -> None:
        for line in self.process.stdout:
            line = line.rstrip("\n")
            self.tail.append(line)
            log(f"[{self.label}] {line}")

    def kill(self) -> None:
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, 9)
            except ProcessLookupError:
                pass
        self.process.wait()
        self.reader.join(timeout=5)


def run_local(manifest: dict, *, timeout: float, log: Callable[[str], None] = print, cwd: str | None = None) -> LocalJobResult:
    """Run the job to completion. Raises LaunchError (with the master's log tail) if it fails or times out."""
    name = manifest["metadata"]["name"]
    pods = _replicas(manifest)
    images = sorted({container.get("image", "") for _, _, container in pods})
    logger.info("local mode: running %s as %d local process group(s); image %s and GPU/node settings are "
                "ignored here", name, len(pods), ", ".join(images))
    replica_specs = manifest["spec"]["pytorchReplicaSpecs"]
    replica_spec = replica_specs.get("Master") or replica_specs["Worker"]
    restart_policy = replica_spec.get("restartPolicy", "Never")
    backoff_limit = manifest["spec"].get("runPolicy", {}).get("backoffLimit", 0)
    deadline = time.monotonic() + timeout
    for attempt in range(1, backoff_limit + 2):
        failure = _attempt(name, pods, manifest["spec"].get("nprocPerNode", "1"), deadline, log, cwd)
        if failure is None:
            return LocalJobResult(attempts=attempt, log_tail="")
        if restart_policy == "Never" or attempt > backoff_limit or failure.startswith("timed out"):
            raise LaunchError(failure)
        logger.warning("%s failed (attempt %d of %d); restarting: %s", name, attempt, backoff_limit + 1,
                       failure.splitlines()[0])
    raise AssertionError("unreachable")


def _attempt(name: str, pods: list, nproc: str, deadline: float, log: Callable[[str], None],
             cwd: str | None) -> str | None:
    """Run every replica once; None on success, else a failure message with the master's log tail."""
    port = _free_port()
    replicas = [_Replica(f"{kind.lower()}-{rank}", _command(container),
                         _environment(container, rank, len(pods), str(nproc), port), cwd, log, cpus)
                for (kind, rank, container), cpus in zip(pods, _cpu_shares(len(pods)))]
    try:
        while True:
            codes = [r.process.poll() for r in replicas]
            failed = next((r for r, code in zip(replicas, codes) if code not in (None, 0)), None)
            if failed is not None or all(code == 0 for code in codes):
                break
            if time.monotonic() > deadline:
                return f"timed out: PyTorchJob {name} still running at its deadline\n" + _tail(replicas[0])
            time.sleep(0.2)
    finally:
        for replica in replicas:
            replica.kill()
    if failed is None:
        return None
    return (f"PyTorchJob {name} failed: {failed.label} exited with code {failed.process.returncode}; "
            f"last lines of master-0:\n{_tail(replicas[0])}")


def _tail(replica: _Replica) -> str:
    return "\n".join(replica.tail)
