"""Booster and plugins: how a model, its optimizer and its checkpoints meet a parallelism.

The interface is shaped like `colossalai.booster.Booster` (boost, backward, no_sync,
loading of model, optimizer and lr scheduler) so the trainers can be handed a real ColossalAI
booster. Plugins say where the process stands (world size, rank, device) and how to wrap a model:

- `SinglePlugin`: one process, CPU or one GPU.
- `DDPPlugin`: `DistributedDataParallel`; gloo on CPU, nccl on GPU.
- `FSDP2Plugin`: `torch.distributed.fsdp.fully_shard` per decoder layer and at the root.
- `ColossalAIPlugin` (`trainer.parallel.colossalai_booster`, the `colossalai` extra): model, optimizer,
  backward, step and checkpoints go through ColossalAI's own `Booster` and one of its plugins
  (TorchDDP, LowLevelZero, Gemini, HybridParallel); `build_booster` picks its `ColossalAIBooster`.

`trainer.parallel.plugins.make_plugin` builds the plugin a config names; this module imports no
other plugin module.

Checkpoints hold *full* (unsharded) state dicts in one file each, written by rank 0 and read by
every rank, so a checkpoint written under one plugin or world size loads under another. Under FSDP2
they are written in shards by every rank instead (`trainer.checkpointing.sharded`, no gather), and
those load under any plugin and world size too (DCP reshards).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trainer.runtime import DistributedEnv

logger = logging.getLogger(__name__)

# torch.distributed.checkpoint.state_dict is imported where it is used, not here: it pulls in DTensor and
# sympy (~50 MB of RSS), which every training process would otherwise hold through its peak.


class Plugin:
    """One process's place in the run and the way it wraps a model. Subclasses override `wrap_model`.

    `world_size` and `rank` place this process among the *data-parallel* replicas (which samples
    it sees); they are the process count and rank except under tensor parallelism.
    """

    booster_class: type[Booster]  # set below `Booster`: the booster that drives this plugin (`build_booster`)
    shards_parameters = False
    """Whether each rank holds only a slice of every parameter (models can then load straight into
    shards, `trainer.modeling.sharded_load`, and checkpoints are written in shards)."""
    rewrites_modules = False
    """Whether the plugin replaces the model's modules or manages their weights' storage itself
    (ColossalAI's `gemini` and `hybrid_parallel`): alignflow then leaves the modules' forwards as
    Hugging Face wrote them (`model.lean_activations` is not applied)."""

    def __init__(self, env: DistributedEnv, device: torch.device) -> None:
        self.env = env
        self.device = device

    @property
    def world_size(self) -> int:
        return self.env.world_size

    @property
    def rank(self) -> int:
        return self.env.rank

    @property
    def is_main_process(self) -> bool:
        return self.env.is_main_process

    def wrap_model(self, model: nn.Module) -> nn.Module:
        return model

    def is_wrapped(self, model: nn.Module) -> bool:
        """Whether `model` was wrapped already (loaded straight into shards), so `Booster.boost` keeps it."""
        return False

    def no_sync(self, model: nn.Module) -> contextlib.AbstractContextManager:
        """Skip the gradient all-reduce for a micro-batch that is not the last of a step."""
        return contextlib.nullcontext()


class SinglePlugin(Plugin):
    pass


class DDPPlugin(Plugin):
    def wrap_model(self, model: nn.Module) -> nn.Module:
        device_ids = [self.device.index] if self.device.type == "cuda" else None
        return nn.parallel.DistributedDataParallel(model, device_ids=device_ids)

    def no_sync(self, model: nn.Module) -> contextlib.AbstractContextManager:
        return model.no_sync()


class FSDP2Plugin(Plugin):
    shards_parameters = True

    def is_wrapped(self, model: nn.Module) -> bool:
        from torch.distributed.fsdp import FSDPModule

        return isinstance(model, FSDPModule)

    def wrap_model(self, model: nn.Module) -> nn.Module:
        from torch.distributed.fsdp import fully_shard

        # Shard each decoder layer on its own so only one layer's full weights exist at a time,
        # then the root for embeddings, norm and heads.
        for module in model.modules():
            layers = getattr(module, "layers", None)
            if isinstance(layers, nn.ModuleList):
                for layer in layers:
                    fully_shard(layer)
        fully_shard(model)
        return model


def build_booster(plugin: Plugin, mixed_precision: str = "auto") -> Booster:
    """The booster that drives `plugin`: `Booster`, or the plugin's own (ColossalAI's)."""
    return plugin.booster_class(plugin, mixed_precision)


def unwrap_model(model: nn.Module) -> nn.Module:
    """The user's module inside a DDP (or ColossalAI) wrapper; FSDP2 shards in place, so it is the model."""
    while hasattr(model, "module") and isinstance(model.module, nn.Module):
        model = model.module
    return model


class Booster:
    """Applies a plugin to a model and its training objects, and saves and loads their state.

    Args:
        plugin: Where this process stands and how models are wrapped.
        mixed_precision: `bf16` for bfloat16 autocast, `no` for fp32; `auto` picks bf16 on
            CUDA devices that support it.
    """

    def __init__(self, plugin: Plugin, mixed_precision: str = "auto") -> None:
        self.plugin = plugin
        device = plugin.device
        if mixed_precision == "auto":
            mixed_precision = "bf16" if device.type == "cuda" and torch.cuda.is_bf16_supported() else "no"
        self.autocast_dtype = torch.bfloat16 if mixed_precision == "bf16" else None
        self._model_of_optimizer: dict[int, nn.Module] = {}

    def boost(self, model: nn.Module, optimizer: torch.optim.Optimizer | None = None, criterion: Any = None,
              dataloader: Any = None, lr_scheduler: Any = None) -> tuple:
        """Move the model to the device and wrap it (one loaded straight into FSDP2 shards, see
        `trainer.modeling.sharded_load`, is already both). The optimizer must be built on the wrapped model.

        Returns:
            (model, optimizer, criterion, dataloader, lr_scheduler), as ColossalAI's booster does.
        """
        if not self.plugin.is_wrapped(model):
            model = self.plugin.wrap_model(model.to(self.plugin.device))
        if optimizer is not None:
            self._model_of_optimizer[id(optimizer)] = model
        return model, optimizer, criterion, dataloader, lr_scheduler

    def register_optimizer(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Tie an optimizer built after `boost` to its model, for saving and loading its state."""
        self._model_of_optimizer[id(optimizer)] = model

    def boost_with_optimizer(self, model: nn.Module, build_optimizer: Callable[[nn.Module], torch.optim.Optimizer],
                             build_scheduler: Callable[[torch.optim.Optimizer], Any]) -> tuple[nn.Module, Any, Any]:
        """Boost a model together with the optimizer and lr scheduler built for it.

        The builders are called at the point the plugin needs: here after wrapping (FSDP2 replaces
        the parameters), for ColossalAI before (its booster wraps model and optimizer together).

        Returns:
            (model, optimizer, scheduler), boosted.
        """
        model, *_ = self.boost(model)
        optimizer = build_optimizer(model)
        self.register_optimizer(model, optimizer)
        return model, optimizer, build_scheduler(optimizer)

    def step(self, model: nn.Module, optimizer: torch.optim.Optimizer, max_grad_norm: float) -> torch.Tensor:
        """Clip the global gradient norm to `max_grad_norm` (0: no clipping), then take the optimizer step
        unless that norm is not finite.

        Returns:
            The global gradient norm before clipping, as a scalar tensor.
        """
        parameters = [p for p in model.parameters() if p.requires_grad]
        grad_norm = torch.nn.utils.clip_grad_norm_(parameters, max_grad_norm if max_grad_norm > 0 else float("inf"))
        grad_norm = grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm
        if torch.isfinite(grad_norm):  # a NaN/inf norm skips the step (see `algorithms.update.train_step`)
            optimizer.step()
        return grad_norm

    def autocast(self) -> contextlib.AbstractContextManager:
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.plugin.device.type, dtype=self.autocast_dtype)

    def backward(self, loss: torch.Tensor, optimizer: torch.optim.Optimizer | None = None) -> None:
        loss.backward()

    def no_sync(self, model: nn.Module, optimizer: torch.optim.Optimizer | None = None):
        return self.plugin.no_sync(model)

    # -- checkpoints: full state dicts (`CheckpointManager` writes them on rank 0), read by every rank --

    def load_model(self, model: nn.Module, checkpoint: str | Path, strict: bool = True, **_: Any) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        state = torch.load(checkpoint, map_location="cpu", weights_only=True)
        set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True, strict=strict))

    def load_optimizer(self, optimizer: torch.optim.Optimizer, checkpoint: str | Path, **_: Any) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        model = self._model_of_optimizer[id(optimizer)]
        state = torch.load(checkpoint, map_location="cpu", weights_only=True)
        set_optimizer_state_dict(model, optimizer, state, options=StateDictOptions(full_state_dict=True))

    def load_lr_scheduler(self, lr_scheduler: Any, checkpoint: str | Path) -> None:
        lr_scheduler.load_state_dict(torch.load(checkpoint, map_location="cpu", weights_only=True))

    def full_state_dict(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """The unsharded weights on CPU (a collective: every rank must call it; complete on rank 0)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))

    def full_optimizer_state_dict(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """The unsharded optimizer state on CPU, keyed by parameter name (a collective)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_optimizer_state_dict(self._model_of_optimizer[id(optimizer)], optimizer, options=options)


Plugin.booster_class = Booster
