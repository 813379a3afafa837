"""Load a model whole and straight into FSDP2 shards on each rank; rank 0 saves what both hold.

Usage: torchrun --nproc_per_node=2 sharded_load_driver.py MODEL_DIR VALUE_MODEL_DIR DUMP_DIR

`<DUMP_DIR>/loads.pt` (rank 0): `plain` and `sharded` (gathered) parameters of the trained model,
the frozen reference's gathered parameters, the models' logits on one batch, the local shard
sizes of every rank (`shard_numel`, `full_numel`), and the same for a reward model
(`value_plain`, `value_sharded`, `value_outputs`).
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from trainer.config import ModelConfig
from trainer.modeling.models import load_causal_lm, load_frozen, load_value_model
from trainer.parallel.booster import FSDP2Plugin
from trainer.runtime import init_process_group, pick_device, read_distributed_env

FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


def main() -> None:
    model_dir, value_dir, dump_dir = sys.argv[1:4]
    env = read_distributed_env()
    device = pick_device(env)
    init_process_group(env, device)
    plugin = FSDP2Plugin(env, device)
    config = ModelConfig(path=model_dir)

    plain = load_causal_lm(config)
    sharded = load_causal_lm(config, plugin=plugin)
    reference = load_frozen(load_causal_lm, config, device, plugin=plugin)
    local = torch.tensor([sum(p.to_local().numel() for p in sharded.parameters())])
    shard_numel = [torch.zeros_like(local) for _ in range(env.world_size)]
    dist.all_gather(shard_numel, local)
    batch = torch.arange(1, 17).reshape(2, 8)
    with torch.no_grad():
        logits = {"plain": plain(input_ids=batch).logits, "sharded": sharded(input_ids=batch).logits,
                  "reference": reference(input_ids=batch).logits}
    value_config = ModelConfig(path=value_dir)
    value_plain = load_value_model(value_config, key="reward.model_path")
    value_sharded = load_frozen(load_value_model, value_config, device, key="reward.model_path", plugin=plugin)
    with torch.no_grad():
        value_outputs = {"plain": value_plain(batch), "sharded": value_sharded(batch)}
    states = {"sharded": get_model_state_dict(sharded, options=FULL),
              "reference": get_model_state_dict(reference, options=FULL),
              "value_sharded": get_model_state_dict(value_sharded, options=FULL)}
    if env.is_main_process:
        torch.save({"plain": plain.state_dict(), **states, "logits": logits, "value_outputs": value_outputs,
                    "value_plain": value_plain.state_dict(),
                    "shard_numel": [int(n) for n in shard_numel],
                    "full_numel": sum(p.numel() for p in plain.parameters()),
                    "reference_requires_grad": any(p.requires_grad for p in reference.parameters())},
                   f"{dump_dir}/loads.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
