"""Each of 2 gloo ranks fetches a sharded checkpoint's small files; rank 1 from a directory that lacks them.

Usage: torchrun --nproc_per_node=2 fetch_agreement_driver.py WHOLE_DIR BROKEN_DIR OUT_DIR

Writes `<OUT_DIR>/rank<R>.txt`: the error each rank raised ("none" if it raised none).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist

from trainer.checkpointing.checkpoint import CheckpointManager
from trainer.parallel.booster import Booster, FSDP2Plugin
from trainer.runtime import read_distributed_env


def main() -> None:
    whole, broken, out = sys.argv[1:4]
    env = read_distributed_env()
    dist.init_process_group("gloo")
    manager = CheckpointManager(Path(out) / "checkpoints", Booster(FSDP2Plugin(env, torch.device("cpu"))))
    directory = whole if env.rank == 0 else broken
    outcome = "none"
    with tempfile.TemporaryDirectory() as scratch:
        try:
            manager._fetch_small_files_agreed(directory, {}, Path(scratch))
        except Exception as err:  # noqa: BLE001  (the test reads which error each rank raised)
            outcome = f"{type(err).__name__}: {err}"
    Path(out, f"rank{env.rank}.txt").write_text(outcome)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
