"""Run one supervised stage under torchrun and dump what the ColossalAI tests compare.

Usage: torchrun --nproc_per_node=N torchrun_colossalai.py STAGE CONFIG DUMP_DIR [STOP_AFTER_STEPS]

Writes `<dump_dir>/rank<R>.pt` (this rank's full weights) and `<dump_dir>/rank<R>.json` (the
boosted model's class and the stage's final metrics).
"""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist

from trainer.config import load_config
from trainer.parallel.booster import unwrap_model
from trainer.runtime import read_distributed_env, setup_logging
from trainer.supervised.stages import run_stage


def main() -> None:
    stage, config_path, dump_dir = sys.argv[1:4]
    stop_after_steps = int(sys.argv[4]) if len(sys.argv) > 4 else None
    env = read_distributed_env()
    setup_logging(env)
    config = load_config(stage, config_path)
    result = run_stage(config, stop_after_steps=stop_after_steps)
    # DDP keeps the full weights on every rank: each rank's own copy shows whether ranks agree.
    state = unwrap_model(result.model).state_dict()
    torch.save({k: v.detach().cpu() for k, v in state.items()}, f"{dump_dir}/rank{env.rank}.pt")
    report = {"model_class": f"{type(result.model).__module__}.{type(result.model).__name__}",
              "metrics": result.metrics}
    with open(f"{dump_dir}/rank{env.rank}.json", "w") as handle:
        json.dump(report, handle)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
