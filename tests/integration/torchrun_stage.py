"""Run one stage under torchrun and dump every rank's full parameters to `<dump_dir>/rank<R>.pt`.

Usage: torchrun --nproc_per_node=2 torchrun_stage.py STAGE CONFIG DUMP_DIR

For ppo the critic's parameters go to `<dump_dir>/rank<R>-critic.pt` as well.
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from trainer.config import load_config
from trainer.online.stages import run_online_stage
from trainer.runtime import read_distributed_env, setup_logging
from trainer.supervised.stages import run_stage


def main() -> None:
    stage, config_path, dump_dir = sys.argv[1:4]
    env = read_distributed_env()
    setup_logging(env)
    config = load_config(stage, config_path)
    if stage in ("ppo", "grpo"):
        result = run_online_stage(config)
        models = {"": result.actor, "-critic": result.critic}
    else:
        models = {"": run_stage(config).model}
    for suffix, model in models.items():
        if model is None:
            continue
        # Without cpu_offload every rank gathers the full tensors (FSDP2 included), so ranks can be compared.
        state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
        torch.save({k: v.detach().cpu() for k, v in state.items()}, f"{dump_dir}/rank{env.rank}{suffix}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
