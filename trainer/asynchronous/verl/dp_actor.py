"""`DataParallelPPOActor` and `DataParallelPPOCritic`: one model's log-prob/value passes and its updates.

Seed: `trinity/trainer/verl/dp_actor.py` (over verl's `DataParallelPPOActor`) and verl's
`DataParallelPPOCritic`. As in the seed, an actor without an optimizer is a reference policy
(only `compute_log_prob`), `set_algorithm` takes the policy loss from the stage's algorithm, and
`update_policy`/`update_critic` take `num_update_epochs` passes over the step's batch in shuffled
minibatches. Each minibatch is one call of `trainer.algorithms.update.train_step`, the optimizer
step of every trainer path, with the objective the colocated loop builds (the algorithm's
`build_actor_objective`/`build_critic_objective`, `trainer.algorithms.online`); the data-parallel part is
the booster's plugin (DDP, FSDP2), not a wrapper of its own.

Metrics: the objective's (`trainer.algorithms.ppo`/`grpo` list them) plus `grad_norm`, `lr` and
`num_units`, each the mean over the step's optimizer steps; the critic's keep the colocated
loop's names (`value_loss`, `critic/grad_norm`, ...). An optimizer step that `train_step` skipped
for a non-finite loss or gradient norm is counted by the model's `NonFiniteGuard` (the one the
supervised loop uses), which ends the run after `train.max_nonfinite_steps` in a row.

Across data-parallel ranks every call must line up: under FSDP2 each forward all-gathers the
layers' weights (a collective), and every optimizer step all-reduces. `compute_log_prob` and
`compute_values` therefore run as many micro-batch forwards on every rank (a rank with fewer rows
repeats its last micro-batch and drops the result, as the colocated evaluation does), and an
update refuses, with an error, ranks whose batches differ in rows: the number of optimizer steps and
micro-batches follows from the row count, so unequal batches would leave collectives unmatched.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from trainer.algorithms.online.ppo import critic_metric_names
from trainer.algorithms.online.registry import online_algorithm
from trainer.algorithms.ppo import response_logps, response_values
from trainer.algorithms.update import NonFiniteGuard, Objective, train_step
from trainer.asynchronous.verl.data_proto import DataProto
from trainer.config import OnlineStageConfig
from trainer.errors import TrainingError
from trainer.online.batches import micro_batches
from trainer.parallel.booster import Booster, Plugin
from trainer.rollout.experience import Experience


def _max_and_min_over_ranks(plugin: Plugin, value: int) -> tuple[int, int]:
    """The largest and smallest `value` over the data-parallel ranks (one all-reduce)."""
    if plugin.world_size == 1 or not dist.is_initialized():
        return value, value
    both = torch.tensor([value, -value], dtype=torch.long, device=plugin.device)
    dist.all_reduce(both, op=dist.ReduceOp.MAX)
    return int(both[0]), -int(both[1])


def forward_chunks(plugin: Plugin, rows: int, micro_batch_size: int) -> int:
    """Micro-batch forwards to run over `rows` rows: this rank's own count, or, when the plugin shards
    parameters (every forward a collective), the most any rank needs."""
    chunks = -(-rows // micro_batch_size)
    return _max_and_min_over_ranks(plugin, chunks)[0] if plugin.shards_parameters else chunks


def chunked_forward(plugin: Plugin, batch: Experience, micro_batch_size: int,
                    forward: Callable[[Experience], Tensor]) -> Tensor:
    """`forward` over `batch` in micro-batches on the plugin's device, concatenated on the batch's device;
    as many forwards as every other rank runs (see the module docstring)."""
    micros = batch.to(plugin.device).split(micro_batch_size)
    parts = []
    for index in range(forward_chunks(plugin, len(batch), micro_batch_size)):
        output = forward(micros[min(index, len(micros) - 1)])  # past its own rows: a stand-in, dropped
        if index < len(micros):
            parts.append(output)
    return torch.cat(parts).to(batch.input_ids.device)


def check_equal_rows(plugin: Plugin, rows: int) -> None:
    """TrainingError unless every rank's update batch has `rows` rows (its steps and micro-batches follow)."""
    most, fewest = _max_and_min_over_ranks(plugin, rows)
    if most != fewest:
        raise TrainingError(f"rank {plugin.rank}: the update batches of the {plugin.world_size} ranks hold "
                            f"{fewest} to {most} rows; every rank must train on as many rows (one optimizer step "
                            "and micro-batch count for all)")


def update_in_minibatches(booster: Booster, model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any,
                          objective: Objective, data: DataProto, config: OnlineStageConfig,
                          generator: torch.Generator, ptx_batches: list[dict] | None = None,
                          first_step: int = 0, guard: NonFiniteGuard | None = None) -> dict[str, float]:
    """`num_update_epochs` shuffled passes over `data` in minibatches of `mini_batch_size`, one `train_step` each.

    Args:
        booster, model, optimizer, scheduler: What is trained.
        objective: Forward pass and loss of a micro-batch.
        data: The step's batch (any device; micro-batches move to the booster's).
        config: Supplies `num_update_epochs`, `mini_batch_size`, `micro_batch_size` and `max_grad_norm`.
        generator: Orders the minibatches (the same seed gives actor and critic the same order).
        ptx_batches: Pretraining batches, cycled through by optimizer step (PPO's ptx loss).
        first_step: Optimizer steps taken before this call (picks the ptx batch; numbers steps in messages).
        guard: Counts skipped (non-finite) optimizer steps; TrainingError after too many in a row.

    Returns:
        The mean of each metric over the optimizer steps, plus `num_optimizer_steps`.
    """
    options, device = config.algorithm, booster.plugin.device
    check_equal_rows(booster.plugin, len(data))
    sums: dict[str, float] = {}
    steps = 0
    for _ in range(options.num_update_epochs):
        order = torch.randperm(len(data), generator=generator)
        for minibatch in data.batch.select(order.to(data.batch.input_ids.device)).split(options.mini_batch_size):
            ptx = ptx_batches[(first_step + steps) % len(ptx_batches)] if ptx_batches else None
            batches = micro_batches(minibatch, config.train.micro_batch_size, device, ptx, pin_memory=True)
            metrics = train_step(booster, model, optimizer, scheduler, batches, objective,
                                 config.optimizer.max_grad_norm)
            steps += 1
            if guard is not None:
                guard.observe(metrics, first_step + steps)
            for key, value in metrics.items():
                sums[key] = sums.get(key, 0.0) + value
    return {key: value / max(steps, 1) for key, value in sums.items()} | {"num_optimizer_steps": float(steps)}


class DataParallelPPOActor:
    """The policy being trained, or (without an optimizer) the frozen reference.

    Args:
        booster: The booster `module` was boosted with.
        module: The (boosted) causal LM.
        optimizer, scheduler: Its optimizer and schedule; None for a reference policy.
        ptx_batches: PPO's pretraining batches for the ptx loss.
    """

    def __init__(self, booster: Booster, module: nn.Module, optimizer: torch.optim.Optimizer | None = None,
                 scheduler: Any = None, ptx_batches: list[dict] | None = None) -> None:
        self.booster = booster
        self.actor_module = module
        self.actor_optimizer = optimizer
        self.actor_scheduler = scheduler
        self.ptx_batches = ptx_batches or []
        self.config: OnlineStageConfig | None = None
        self.policy_loss_fn: Objective | None = None
        self.num_optimizer_steps = 0
        self.nonfinite: NonFiniteGuard | None = None

    def set_algorithm(self, config: OnlineStageConfig) -> None:
        """Take the policy objective (GRPO's or PPO's) from the stage's algorithm, and the update sizes."""
        self.config = config
        self.policy_loss_fn = online_algorithm(config).build_actor_objective()

    @torch.no_grad()
    def compute_log_prob(self, data: DataProto, micro_batch_size: int | None = None) -> Tensor:
        """(B, T) log-probs of the batch's tokens under this model, 0 outside the response."""
        batch = data.batch
        was_training = self.actor_module.training
        self.actor_module.eval()
        logps = chunked_forward(  # no autocast: as the explorer computes them
            self.booster.plugin, batch, micro_batch_size or len(batch),
            lambda micro: response_logps(self.actor_module, micro.as_batch()) * micro.action_mask)
        self.actor_module.train(was_training)
        return logps

    def update_policy(self, data: DataProto, generator: torch.Generator) -> dict[str, float]:
        """Train on the batch (which has `old_logps`, `advantages`, maybe `importance_weights`)."""
        if self.actor_optimizer is None or self.policy_loss_fn is None or self.config is None:
            raise RuntimeError("update_policy needs an actor with an optimizer after set_algorithm")
        metrics = update_in_minibatches(self.booster, self.actor_module, self.actor_optimizer, self.actor_scheduler,
                                        self.policy_loss_fn, data, self.config, generator, self.ptx_batches,
                                        self.num_optimizer_steps, self.nonfinite)
        self.num_optimizer_steps += int(metrics["num_optimizer_steps"])
        if self.nonfinite is not None:
            metrics["train/nonfinite_skipped"] = float(self.nonfinite.total)
        return metrics


class DataParallelPPOCritic:
    """PPO's value model: per-token values and the clipped value-loss update."""

    def __init__(self, booster: Booster, module: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any,
                 config: OnlineStageConfig) -> None:
        self.booster = booster
        self.critic_module = module
        self.critic_optimizer = optimizer
        self.critic_scheduler = scheduler
        self.config = config
        self.value_loss_fn = online_algorithm(config).build_critic_objective()
        self.num_optimizer_steps = 0
        self.nonfinite: NonFiniteGuard | None = None

    @torch.no_grad()
    def compute_values(self, data: DataProto, micro_batch_size: int | None = None) -> Tensor:
        """(B, T) value of the state before each token, 0 outside the response."""
        batch = data.batch
        return chunked_forward(self.booster.plugin, batch, micro_batch_size or len(batch),
                               lambda micro: response_values(self.critic_module, micro.as_batch()) * micro.action_mask)

    def update_critic(self, data: DataProto, generator: torch.Generator) -> dict[str, float]:
        """Train the value model on the batch (which has `values` and `returns`)."""
        metrics = update_in_minibatches(self.booster, self.critic_module, self.critic_optimizer, self.critic_scheduler,
                                        self.value_loss_fn, data, self.config, generator,
                                        first_step=self.num_optimizer_steps, guard=self.nonfinite)
        self.num_optimizer_steps += int(metrics["num_optimizer_steps"])
        if self.nonfinite is not None:
            metrics["nonfinite_skipped"] = float(self.nonfinite.total)
        return critic_metric_names(metrics)
