"""Run one stage under torchrun and dump every rank's full parameters to `<dump_dir>/rank<R>.pt`.

Usage: torchrun --nproc_per_node=2 torchrun_stage.py STAGE CONFIG DUMP_DIR
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from trainer.config import load_config
from trainer.runtime import read_distributed_env, setup_logging
from trainer.stages import run_stage


def main() -> None:
    stage, config_path, dump_dir = sys.argv[1:4]
    env = read_distributed_env()
    setup_logging(env)
    result = run_stage(load_config(stage, config_path))
    # Without cpu_offload every rank gathers the full tensors (FSDP2 included), so ranks can be compared.
    state = get_model_state_dict(result.model, options=StateDictOptions(full_state_dict=True))
    torch.save({k: v.detach().cpu() for k, v in state.items()}, f"{dump_dir}/rank{env.rank}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
