"""The process's place in a distributed run, read once from the environment.

torchrun (and the Training Operator, through torchrun) describes the run in environment variables.
This is the one module that reads them; everything else receives a `DistributedEnv`.
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass

import torch
import torch.distributed as dist

from trainer.redact import install_log_redaction


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


def pick_device(env: DistributedEnv) -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", env.local_rank % torch.cuda.device_count())
    return torch.device("cpu")


def init_process_group(env: DistributedEnv, device: torch.device) -> None:
    """Join the process group torchrun set up: nccl on CUDA, gloo on CPU. No-op for one process."""
    if env.is_distributed and not dist.is_initialized():
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")


def all_reduce_sum(value: torch.Tensor) -> torch.Tensor:
    """Sum a tensor over all ranks (in place and returned); identity outside a process group."""
    if dist.is_initialized():
        dist.all_reduce(value, op=dist.ReduceOp.SUM)
    return value


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


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
