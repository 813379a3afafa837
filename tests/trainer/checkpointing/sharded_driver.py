"""Run an SFT stage under torchrun; rank 0 dumps the full parameters, every rank the shard files it read.

Usage: torchrun --nproc_per_node=N sharded_driver.py CONFIG DUMP_DIR [STOP_AFTER_STEPS]

`<DUMP_DIR>/params.pt`: the trained model's full parameters (rank 0). `<DUMP_DIR>/read-rank<R>.json`:
the files of each DCP directory rank R read when it resumed (only when it resumed from shards).
"""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from trainer.checkpointing.sharded_checkpoints import ShardedCheckpoints
from trainer.config import load_config
from trainer.runtime import read_distributed_env, setup_logging
from trainer.supervised.stages import run_stage


def main() -> None:
    config_path, dump_dir = sys.argv[1:3]
    stop_after = int(sys.argv[3]) if len(sys.argv) > 3 else None
    env = read_distributed_env()
    setup_logging(env)
    load_sharded = ShardedCheckpoints._load_sharded

    def recording_load(self, directory, components):  # observes which files this rank read; changes nothing
        state = load_sharded(self, directory, components)
        with open(f"{dump_dir}/read-rank{env.rank}.json", "w") as file:
            json.dump(self.shard_files_read, file)
        return state

    ShardedCheckpoints._load_sharded = recording_load
    model = run_stage(load_config("sft", config_path), stop_after_steps=stop_after).model
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if env.is_main_process:
        torch.save({k: v.detach().clone() for k, v in state.items()}, f"{dump_dir}/params.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
