"""`make_plugin`: the plugin a stage's `parallel.plugin` names.

The plugins themselves are `trainer.parallel.booster`'s (`SinglePlugin`, `DDPPlugin`, `FSDP2Plugin`)
and `trainer.parallel.colossalai_booster.ColossalAIPlugin` (the `colossalai` extra, imported only
when a config names it). This module sits above both, so the interface imports no implementation.
"""

from __future__ import annotations

import torch

from trainer.config import ParallelConfig
from trainer.errors import ConfigError
from trainer.parallel.booster import DDPPlugin, FSDP2Plugin, Plugin, SinglePlugin
from trainer.runtime import DistributedEnv

PLUGINS: dict[str, type[Plugin]] = {
    "single": SinglePlugin,
    "ddp": DDPPlugin,
    "fsdp2": FSDP2Plugin,
}


def make_plugin(parallel: ParallelConfig, env: DistributedEnv, device: torch.device,
                max_grad_norm: float = 0.0) -> Plugin:
    """Build the plugin named by `parallel.plugin`; `auto` is ddp with several processes, else single.

    Args:
        parallel: The stage's `parallel` section.
        env: This process's place in the run.
        device: Where this process trains.
        max_grad_norm: `optimizer.max_grad_norm`; ColossalAI's sharded plugins clip inside their
            optimizer step, so they need it when they are built.

    Returns:
        The plugin; `colossalai` imports ColossalAI (`trainer.parallel.colossalai_booster`) only then.

    Raises:
        ConfigError: `single` was asked for in a run of several processes.
    """
    name = parallel.plugin
    if name == "auto":
        name = "ddp" if env.is_distributed else "single"
    if name == "single" and env.is_distributed:
        raise ConfigError(f"parallel.plugin is 'single' but WORLD_SIZE is {env.world_size}; use ddp or fsdp2")
    if name == "colossalai":
        from trainer.parallel.colossalai_booster import ColossalAIPlugin

        return ColossalAIPlugin(env, device, parallel.colossalai_options, max_grad_norm)
    return PLUGINS[name](env, device)
