"""The process's place in a distributed run, read once from the environment.

torchrun (and the Training Operator, through torchrun) describes the run in environment variables.
This is the one module that reads them; everything else receives a `DistributedEnv`.

torch is imported by the functions that use it, not with this module: the entry point reads the
environment and the config first, so `--help`, `--help-config` and a bad config answer without
loading torch (seconds).
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from trainer.redact import install_log_redaction

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class DistributedEnv:
    rank: int
    local_rank: int
    world_size: int

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main_process(self) -> bool:
        return self.rank == 0


def read_distributed_env(environ: dict[str, str] | None = None) -> DistributedEnv:
    environ = os.environ if environ is None else environ
    return DistributedEnv(
        rank=int(environ.get("RANK", 0)),
        local_rank=int(environ.get("LOCAL_RANK", 0)),
        world_size=int(environ.get("WORLD_SIZE", 1)),
    )


@dataclass(frozen=True, slots=True)
class TrackingEnv:
    """Tracking settings that come from the environment (MLflow's own variables and the pipeline's)."""

    tracking_uri: str | None
    run_id: str | None
    experiment_id: str | None
    experiment_name: str | None
    parent_run_id: str | None
    pipeline_run_id: str | None


def read_tracking_env(environ: dict[str, str] | None = None) -> TrackingEnv:
    environ = os.environ if environ is None else environ
    return TrackingEnv(
        tracking_uri=environ.get("MLFLOW_TRACKING_URI") or None,
        run_id=environ.get("MLFLOW_RUN_ID") or None,
        experiment_id=environ.get("MLFLOW_EXPERIMENT_ID") or None,
        experiment_name=environ.get("MLFLOW_EXPERIMENT_NAME") or None,
        parent_run_id=environ.get("ALIGNFLOW_PARENT_RUN_ID") or None,
        pipeline_run_id=environ.get("ALIGNFLOW_PIPELINE_RUN_ID") or None,
    )


@dataclass(frozen=True, slots=True)
class TrainJobStatusEnv:
    """Where a TrainJob takes its progress (Kubeflow Trainer's `TrainJobStatus` plugin; `trainer.tracking.trainjob_status`)."""

    url: str
    ca_cert_path: str | None
    token_path: str | None


def read_trainjob_status_env(environ: dict[str, str] | None = None) -> TrainJobStatusEnv | None:
    """The status endpoint's variables, or None where Trainer injected none (no TrainJob, or the gate is off)."""
    environ = os.environ if environ is None else environ
    url = environ.get("KUBEFLOW_TRAINER_SERVER_URL")
    if not url:
        return None
    return TrainJobStatusEnv(url=url, ca_cert_path=environ.get("KUBEFLOW_TRAINER_SERVER_CA_CERT") or None,
                             token_path=environ.get("KUBEFLOW_TRAINER_SERVER_TOKEN") or None)


CGROUP_CPU_MAX = "/sys/fs/cgroup/cpu.max"  # cgroup v2: "<quota> <period>" in microseconds, or "max <period>"
CGROUP_V1_QUOTA = "/sys/fs/cgroup/cpu/cpu.cfs_quota_us"  # cgroup v1: -1 when unlimited


def cgroup_cpu_quota(cpu_max: str = CGROUP_CPU_MAX, v1_quota: str = CGROUP_V1_QUOTA) -> float | None:
    """CPUs the process's cgroup may use (quota / period, e.g. 1.5), or None when no quota is set.

    A Kubernetes CPU limit becomes this quota; the node's CPU count and the process's affinity do not
    see it, which is why torch's default thread count oversubscribes a limited pod.
    """
    try:
        quota, period = Path(cpu_max).read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:  # cgroup v1: quota and period in two files
        quota = int(Path(v1_quota).read_text())
        period = int((Path(v1_quota).parent / "cpu.cfs_period_us").read_text())
        return None if quota <= 0 else quota / period
    except (OSError, ValueError):
        return None


def available_cpus(cpu_max: str = CGROUP_CPU_MAX, v1_quota: str = CGROUP_V1_QUOTA) -> int:
    """CPUs this process may run on: its affinity set, capped by the cgroup quota (rounded down, at least 1)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    quota = cgroup_cpu_quota(cpu_max, v1_quota)
    if quota is not None:
        cpus = min(cpus, max(1, int(quota)))
    return cpus


def configure_threads(requested: int | None, environ: dict[str, str] | None = None, *,
                      cpu_max: str = CGROUP_CPU_MAX, v1_quota: str = CGROUP_V1_QUOTA) -> int:
    """Set torch's intra-op thread count and log it; returns the count.

    Args:
        requested: `train.num_threads`; None shares the CPUs this process may use (`available_cpus`)
            equally among the ranks torchrun started on this node (LOCAL_WORLD_SIZE).
        environ: The environment to read LOCAL_WORLD_SIZE from (default: os.environ).
        cpu_max: The cgroup v2 `cpu.max` file.
        v1_quota: The cgroup v1 `cpu.cfs_quota_us` file (read when `cpu_max` is absent).
    """
    environ = os.environ if environ is None else environ
    if requested is not None:
        threads, reason = requested, "train.num_threads"
    else:
        cpus, local_ranks = available_cpus(cpu_max, v1_quota), max(1, int(environ.get("LOCAL_WORLD_SIZE", 1)))
        quota = cgroup_cpu_quota(cpu_max, v1_quota)
        threads = max(1, cpus // local_ranks)
        reason = (f"{cpus} CPUs available (cgroup quota {'none' if quota is None else f'{quota:g}'}) "
                  f"shared by {local_ranks} rank(s) on this node")
    import torch

    torch.set_num_threads(threads)
    logger.info("torch intra-op threads: %d (%s)", threads, reason)
    return threads


def pick_device(env: DistributedEnv) -> torch.device:
    import torch

    if torch.cuda.is_available():
        return torch.device("cuda", env.local_rank % torch.cuda.device_count())
    return torch.device("cpu")


def init_process_group(env: DistributedEnv, device: torch.device) -> None:
    """Join the process group torchrun set up: nccl on CUDA, gloo on CPU. No-op for one process."""
    import torch
    import torch.distributed as dist

    if env.is_distributed and not dist.is_initialized():
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")


def all_reduce_sum(value: torch.Tensor) -> torch.Tensor:
    """Sum a tensor over all ranks (in place and returned); identity outside a process group."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.all_reduce(value, op=dist.ReduceOp.SUM)
    return value


def any_rank_failed(failed: bool, device: torch.device) -> bool:
    """Whether this or any other rank failed (a collective: every rank must call it, failed or not)."""
    import torch

    return bool(all_reduce_sum(torch.tensor([1.0 if failed else 0.0], device=device)).item())


def barrier() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()


def leave_process_group() -> None:
    """Destroy the process group if this process joined one.

    A process that never imported `torch.distributed` has none, so this imports nothing then (the
    entry point calls it on every exit, including a bad config's).
    """
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def setup_logging(env: DistributedEnv) -> None:
    """Rank 0 logs at INFO, other ranks only warnings, each line tagged with its rank."""
    level = logging.INFO if env.is_main_process else logging.WARNING
    logging.basicConfig(
        level=level,
        stream=sys.stderr,
        format=f"%(asctime)s [rank{env.rank}] %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
        force=True,
    )
    install_log_redaction()  # URIs' user info and known secret values never reach the log
