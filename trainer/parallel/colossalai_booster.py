"""ColossalAI behind the project's `Booster`: its own `Booster` and plugins do the work.

`parallel.plugin: colossalai` builds a `ColossalAIPlugin`, and `build_booster` gives it a
`ColossalAIBooster`, which hands model, optimizer and lr scheduler to `colossalai.booster.Booster`
together (`boost`), and routes `backward`, `no_sync`, the optimizer step and every checkpoint
save/load through it, so the plugin chosen under `parallel.colossalai.plugin` decides how they happen:

- `torch_ddp` (`TorchDDPPlugin`): DDP; the only one that runs on CPU (gloo). Clipping is ColossalAI's
  `OptimizerWrapper.clip_grad_by_norm`; bf16 autocast as with the other boosters.
- `low_level_zero` (`LowLevelZeroPlugin`, ZeRO-1/2), `gemini` (`GeminiPlugin`, chunked ZeRO-3;
  its optimizer must be ColossalAI's `HybridAdam`, so AdamW is rebuilt as one with the same groups),
  `hybrid_parallel` (`HybridParallelPlugin`, tensor parallel + ZeRO, no pipeline): CUDA only. They
  keep the model in `train.mixed_precision` themselves (no autocast) and clip inside their optimizer
  step with `optimizer.max_grad_norm`, given when the plugin is built.

Checkpoints: each state is saved unsharded by ColossalAI's checkpoint IO (gathered on rank 0) and
handed to `CheckpointManager` as a full state dict, so the model weights are the plain HF state dict
any plugin loads. The optimizer state is ColossalAI's (keyed by parameter index): it resumes under
any ColossalAI plugin and world size, but not under `ddp`/`fsdp2`, whose files are keyed by name.
Loading reads the stored file with `torch.load(weights_only=True)` (nothing from shared storage is
unpickled, see `trainer.checkpointing.serialization`) and gives ColossalAI a copy written to a private scratch file.

Pipeline parallelism is left out on purpose: ColossalAI's pipeline schedule (`execute_pipeline`)
replaces the single model call that every objective in `trainer/algorithms/` makes.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from trainer.config import ColossalAIConfig
from trainer.errors import ConfigError
from trainer.parallel.booster import Booster, Plugin
from trainer.runtime import DistributedEnv


class ColossalAIPlugin(Plugin):
    """Where this process stands in a ColossalAI run, and how to build ColossalAI's plugin.

    Args:
        env: This process's place among all processes.
        device: Where it trains; every ColossalAI plugin but `torch_ddp` needs CUDA.
        options: The `parallel.colossalai` section.
        max_grad_norm: `optimizer.max_grad_norm` (0: no clipping), for the plugins that clip in their step.
    """

    def __init__(self, env: DistributedEnv, device: torch.device, options: ColossalAIConfig,
                 max_grad_norm: float = 0.0) -> None:
        super().__init__(env, device)
        try:
            import colossalai  # noqa: F401
        except ImportError as err:
            raise ConfigError("parallel.plugin is 'colossalai' but colossalai is not importable here "
                              f"({err}); install the `colossalai` extra in its own environment "
                              "(`make test-colossalai` builds one; see docs/models.md, ColossalAI)") from err
        if options.plugin != "torch_ddp" and device.type != "cuda":
            raise ConfigError(f"parallel.colossalai.plugin is {options.plugin!r}, which needs CUDA; this process "
                              "has no GPU (only torch_ddp runs on CPU)")
        if env.world_size % options.tp_size:
            raise ConfigError(f"parallel.colossalai.tp_size is {options.tp_size} but WORLD_SIZE is {env.world_size}; "
                              "the process count must be a multiple of it")
        self.options = options
        self.max_grad_norm = max_grad_norm
        if not dist.is_initialized():  # one process: ColossalAI still wants a process group
            dist.init_process_group("nccl" if device.type == "cuda" else "gloo", store=dist.HashStore(),
                                    rank=0, world_size=1)

    @property
    def rewrites_modules(self) -> bool:
        """`hybrid_parallel` swaps modules for tensor-parallel ones and `gemini` moves weights between chunks."""
        return self.options.plugin in ("gemini", "hybrid_parallel")

    @property
    def world_size(self) -> int:
        """Data-parallel replicas: the processes of one tensor-parallel group share their samples."""
        return self.env.world_size // self.options.tp_size

    @property
    def rank(self) -> int:
        # HybridParallelPlugin (pp = sp = 1) puts tensor parallelism on the fastest mesh axis.
        return self.env.rank // self.options.tp_size

    def build_colossal_plugin(self, precision: str) -> Any:
        """ColossalAI's plugin for `parallel.colossalai`, training in `precision` (`bf16` or `fp32`)."""
        from colossalai.booster.plugin import GeminiPlugin, HybridParallelPlugin, LowLevelZeroPlugin, TorchDDPPlugin

        options = self.options
        # The sharded plugins only report the gradient norm when they clip; inf clips nothing.
        max_norm = self.max_grad_norm if self.max_grad_norm > 0 else float("inf")
        if options.plugin == "torch_ddp":
            return TorchDDPPlugin()
        if options.plugin == "low_level_zero":
            return LowLevelZeroPlugin(stage=options.resolved_zero_stage, precision=precision, max_norm=max_norm,
                                      cpu_offload=options.cpu_offload)
        if options.plugin == "gemini":
            if precision == "fp32":
                raise ConfigError("parallel.colossalai.plugin is 'gemini', which trains in bf16 or fp16; "
                                  "train.mixed_precision is 'no': set it to bf16 (or auto on a bf16 GPU)")
            return GeminiPlugin(precision=precision, max_norm=max_norm, enable_gradient_accumulation=True,
                                offload_optim_frac=1.0 if options.cpu_offload else 0.0)
        return HybridParallelPlugin(tp_size=options.tp_size, pp_size=1, zero_stage=options.resolved_zero_stage,
                                    precision=precision, max_norm=max_norm, cpu_offload=options.cpu_offload)


class ColossalAIBooster(Booster):
    """The project's booster interface carried out by `colossalai.booster.Booster`.

    Args:
        plugin: The run's `ColossalAIPlugin`.
        mixed_precision: As for `Booster`; the plugins that control precision take it as theirs.
    """

    def __init__(self, plugin: ColossalAIPlugin, mixed_precision: str = "auto") -> None:
        from colossalai.booster import Booster as ColossalBooster

        super().__init__(plugin, mixed_precision)
        self.options = plugin.options
        colossal_plugin = plugin.build_colossal_plugin("bf16" if self.autocast_dtype is not None else "fp32")
        self.colossal = ColossalBooster(plugin=colossal_plugin)
        if colossal_plugin.control_precision():
            self.autocast_dtype = None  # the plugin keeps the weights in that precision itself
        # `train_step` divides by the unit count of *all* processes, which counts each sample once per
        # tensor-parallel rank; gradients are then averaged over data-parallel replicas only.
        self.loss_scale = float(self.options.tp_size)

    def boost(self, model: nn.Module, optimizer: torch.optim.Optimizer | None = None, criterion: Any = None,
              dataloader: Any = None, lr_scheduler: Any = None) -> tuple:
        """ColossalAI's `boost`: model and optimizer are wrapped together (and moved to the device).

        Returns:
            (model, optimizer, criterion, dataloader, lr_scheduler), boosted by ColossalAI.
        """
        return tuple(self.colossal.boost(model, optimizer, criterion, dataloader, lr_scheduler))

    def boost_with_optimizer(self, model: nn.Module, build_optimizer: Callable[[nn.Module], torch.optim.Optimizer],
                             build_scheduler: Callable[[torch.optim.Optimizer], Any]) -> tuple[nn.Module, Any, Any]:
        """Build optimizer and scheduler on the plain model, then let ColossalAI boost all three.

        Returns:
            (model, optimizer, scheduler) as ColossalAI wrapped them.
        """
        optimizer = build_optimizer(model)
        if self.options.plugin == "gemini":
            optimizer = as_hybrid_adam(optimizer)
        scheduler = build_scheduler(optimizer)
        model, optimizer, _, _, scheduler = self.boost(model, optimizer, lr_scheduler=scheduler)
        return model, optimizer, scheduler

    def backward(self, loss: torch.Tensor, optimizer: torch.optim.Optimizer | None = None) -> None:
        self.colossal.backward(loss * self.loss_scale if self.loss_scale != 1 else loss, optimizer)

    def no_sync(self, model: nn.Module, optimizer: torch.optim.Optimizer | None = None):
        """ColossalAI's `no_sync` where the plugin has one (DDP, ZeRO-1, hybrid); else gradients sync every time."""
        if self.colossal.plugin.support_no_sync():
            return self.colossal.no_sync(model, optimizer)
        return contextlib.nullcontext()

    def step(self, model: nn.Module, optimizer: Any, max_grad_norm: float) -> torch.Tensor:
        """Clip and step through ColossalAI's optimizer wrapper.

        With `torch_ddp` a non-finite norm skips the step, as with the other boosters. The sharded
        optimizers compute the norm inside their step, so they skip only where their own overflow
        check does (fp16 loss scaling); in bf16 a non-finite norm is reported, not skipped.

        Returns:
            The global gradient norm before clipping, as a scalar tensor.
        """
        if self.options.plugin == "torch_ddp":
            grad_norm = optimizer.clip_grad_by_norm(max_grad_norm if max_grad_norm > 0 else float("inf"))
            if torch.isfinite(grad_norm):
                optimizer.step()
            return grad_norm
        optimizer.step()  # the sharded optimizers clip here, with the max_norm their plugin was built with
        return torch.as_tensor(float(optimizer.get_grad_norm()))

    # -- checkpoints: ColossalAI's checkpoint IO, unsharded ------------------------------------------

    def full_state_dict(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """The unsharded weights on CPU, gathered by ColossalAI (a collective; complete on rank 0, {} elsewhere)."""
        return self._save_and_read(lambda path: self.colossal.save_model(model, path, shard=False))

    def full_optimizer_state_dict(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """ColossalAI's unsharded optimizer state on CPU (a collective; complete on rank 0, {} elsewhere)."""
        return self._save_and_read(lambda path: self.colossal.save_optimizer(optimizer, path, shard=False))

    def load_model(self, model: nn.Module, checkpoint: str | Path, strict: bool = True, **_: Any) -> None:
        self._load_through(lambda path: self.colossal.load_model(model, path, strict=strict), checkpoint)

    def load_optimizer(self, optimizer: torch.optim.Optimizer, checkpoint: str | Path, **_: Any) -> None:
        self._load_through(lambda path: self.colossal.load_optimizer(optimizer, path), checkpoint)

    def load_lr_scheduler(self, lr_scheduler: Any, checkpoint: str | Path) -> None:
        self._load_through(lambda path: self.colossal.load_lr_scheduler(lr_scheduler, path), checkpoint)

    def _save_and_read(self, save: Callable[[str], None]) -> dict[str, Any]:
        with tempfile.TemporaryDirectory(prefix="alignflow-colossalai-") as scratch:
            path = str(Path(scratch) / "state.bin")
            save(path)  # every rank takes part; ColossalAI writes on the main process only
            if not self.plugin.is_main_process:
                return {}
            return torch.load(path, map_location="cpu", weights_only=True)

    @staticmethod
    def _load_through(load: Callable[[str], None], checkpoint: str | Path) -> None:
        # ColossalAI's loaders unpickle freely: they get a copy of data already read as plain tensors.
        state = torch.load(checkpoint, map_location="cpu", weights_only=True)
        with tempfile.TemporaryDirectory(prefix="alignflow-colossalai-") as scratch:
            path = str(Path(scratch) / "state.bin")
            torch.save(state, path)
            load(path)


def as_hybrid_adam(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """The same AdamW (groups, lr, betas, eps, weight decay) as ColossalAI's `HybridAdam`, which Gemini requires."""
    from colossalai.nn.optimizer import HybridAdam

    if not isinstance(optimizer, torch.optim.AdamW):
        raise ConfigError(f"parallel.colossalai.plugin 'gemini' rebuilds AdamW as HybridAdam; got {type(optimizer).__name__}")
    defaults = optimizer.defaults
    groups = [{"params": group["params"], "weight_decay": group["weight_decay"]} for group in optimizer.param_groups]
    return HybridAdam(groups, lr=defaults["lr"], betas=defaults["betas"], eps=defaults["eps"],
                      weight_decay=defaults["weight_decay"], adamw_mode=True)


ColossalAIPlugin.booster_class = ColossalAIBooster
