"""For each model family: load whole and into FSDP2 shards, and train SFT through a DCP resume, on 2 gloo ranks.

Usage: torchrun --nproc_per_node=2 families_fsdp2_driver.py WORK_DIR FAMILY...

`<WORK_DIR>/<FAMILY>/sft.yaml` is the family's SFT config (`parallel.plugin: fsdp2`, `model.path` its
tiny model) and `<WORK_DIR>/<FAMILY>/reward-model` a reward model trained from it (the `rm` stage's
export). Rank 0 writes `<WORK_DIR>/<FAMILY>/loads.pt`, each model loaded whole (`*_whole`) and into
shards (`*_sharded`, gathered): the causal LM (`lm_*`, with `lm_logits` of both on one batch and
every rank's `shard_numel` against `full_numel`), the frozen reference (`reference_sharded`,
`reference_requires_grad`), the reward model (`reward_*`) and a critic started from the causal LM
(`critic_*`: backbone and a new head); and the SFT run's parameters after it stopped at step 1 and a
second run resumed it from its DCP checkpoint (`sft`). One process start serves every family.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from trainer.config import ModelConfig, load_config
from trainer.modeling.models import load_causal_lm, load_frozen, load_value_model
from trainer.parallel.booster import FSDP2Plugin
from trainer.runtime import init_process_group, pick_device, read_distributed_env, setup_logging
from trainer.supervised.stages import run_stage

FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)  # rank 0 gets the whole tensors
BATCH = torch.arange(5, 21).reshape(2, 8)


def gathered(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().clone() for name, tensor in get_model_state_dict(model, options=FULL).items()}


def shard_sizes(model: nn.Module, world_size: int) -> list[int]:
    """How many parameter elements each rank holds."""
    local = torch.tensor([sum(parameter.to_local().numel() for parameter in model.parameters())])
    sizes = [torch.zeros_like(local) for _ in range(world_size)]
    dist.all_gather(sizes, local)
    return [int(size) for size in sizes]


@torch.no_grad()
def causal_lm_loads(config: ModelConfig, plugin: FSDP2Plugin, world_size: int) -> dict:
    whole, sharded = load_causal_lm(config), load_causal_lm(config, plugin=plugin)
    reference = load_frozen(load_causal_lm, config, plugin.device, plugin=plugin)
    sizes = shard_sizes(sharded, world_size)  # before a forward: the root's parameters stay gathered after one
    return {"lm_whole": whole.state_dict(), "lm_sharded": gathered(sharded), "reference_sharded": gathered(reference),
            "reference_requires_grad": any(parameter.requires_grad for parameter in reference.parameters()),
            "lm_logits": {"whole": whole(input_ids=BATCH).logits, "sharded": sharded(input_ids=BATCH).logits,
                          "reference": reference(input_ids=BATCH).logits},
            "shard_numel": sizes, "full_numel": sum(parameter.numel() for parameter in whole.parameters())}


@torch.no_grad()
def value_model_loads(name: str, path: Path, key: str, plugin: FSDP2Plugin) -> dict:
    config = ModelConfig(path=str(path))
    whole = load_value_model(config, key=key)
    sharded = load_frozen(load_value_model, config, plugin.device, key=key, plugin=plugin)
    return {f"{name}_whole": whole.state_dict(), f"{name}_sharded": gathered(sharded),
            f"{name}_outputs": {"whole": whole(BATCH), "sharded": sharded(BATCH)}}


def main() -> None:
    work, families = Path(sys.argv[1]), sys.argv[2:]
    env = read_distributed_env()
    setup_logging(env)
    device = pick_device(env)
    init_process_group(env, device)
    plugin = FSDP2Plugin(env, device)
    for family in families:
        config = load_config("sft", str(work / family / "sft.yaml"))
        loads = causal_lm_loads(config.model, plugin, env.world_size)
        loads |= value_model_loads("reward", work / family / "reward-model", "reward.model_path", plugin)
        loads |= value_model_loads("critic", Path(config.model.path), "ppo.critic_model_path", plugin)
        run_stage(config, stop_after_steps=1)
        loads["sft"] = gathered(run_stage(config).model)  # resumed from step 1's DCP shards
        if env.is_main_process:
            torch.save(loads, work / family / "loads.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
