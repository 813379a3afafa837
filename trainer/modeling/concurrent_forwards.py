"""Two independent forwards at once on the CPU, each on its share of the intra-op threads.

A live-reference DPO step needs the reference's log-probs and the policy's before anything else, and neither
depends on the other. On the CPU a small model's ops are too small for two OpenMP threads to share one well: the
tiny preset's DPO step ran only 1.15-1.3x faster on 2 threads than on 1 (benchmarks/README.md, issue 49). Run side
by side, one forward per thread, the two keep both cores busy instead: `dpo_short` went from 3815-4035 to
4632-4843 tokens/s (1.20-1.27x), the same loss to the last digit shown (5 December 2026). The backward that
follows runs on every thread again.

Where it is not used: on accelerators (their kernels are queued, not run, by the Python thread); with one
intra-op thread; and where a forward is a collective (an FSDP2-sharded model all-gathers its layers, and two
threads issuing collectives could order them differently on different ranks).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from typing import TypeVar

import torch
from torch import nn

from trainer.parallel.booster import unwrap_model

SideResult = TypeVar("SideResult")
MainResult = TypeVar("MainResult")

# One thread for every side forward of the process: a step runs at most one beside its own.
_SIDE = ThreadPoolExecutor(1, thread_name_prefix="side-forward")


def can_run_concurrently(*models: nn.Module | None, device: torch.device) -> bool:
    """Whether forwards of `models` may run side by side (the module docstring)."""
    from torch.distributed.fsdp import FSDPModule

    if device.type != "cpu" or torch.get_num_threads() < 2:
        return False
    return not any(isinstance(model, FSDPModule) or isinstance(unwrap_model(model), FSDPModule)
                   for model in models if model is not None)


def run_concurrently(side: Callable[[], SideResult], main: Callable[[], MainResult]) -> tuple[SideResult, MainResult]:
    """`side()` on a second thread while `main()` runs on this one, each with half of the intra-op threads (main the
    larger half); (side's result, main's). Grad mode is per thread: `side` runs with autograd on unless it says
    otherwise, as a new thread does. The thread count is restored, and `side` finished, before returning or raising.
    """
    threads = torch.get_num_threads()
    side_threads = threads // 2

    def run_side() -> SideResult:
        torch.set_num_threads(side_threads)
        return side()

    torch.set_num_threads(threads - side_threads)
    future = _SIDE.submit(run_side)
    try:
        main_result = main()
        return future.result(), main_result
    finally:
        wait([future])
        torch.set_num_threads(threads)
