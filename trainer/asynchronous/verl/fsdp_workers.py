"""`ActorRolloutRefWorker` and `CriticWorker`: the seed's workers as plain objects of the trainer process.

Seed: `trinity/trainer/verl/fsdp_workers.py`, where each is a Ray actor group whose methods are
dispatched to every rank. Here `TorchTrainEngine` owns one of each and calls them directly; the
method names, what each computes and the order the engine calls them in follow the seed. Two
things differ, on purpose:

- "Rollout" is the explorer's job (`trainer.asynchronous.explorer`): this worker holds the actor
  and the reference, not an inference engine.
- The seed's `sync_weight` broadcasts parameters to the inference engine over a collective group
  that `setup_weight_sync_group` creates (its "nccl" sync method). With no separate inference
  engine here there is no such group: `setup_weight_sync_group` has nothing to set up (as in the
  seed for the other methods) and `sync_weight` raises. Weights reach explorers through
  `save_state_dict` (weights directory) or `upload_state_dict` (in-process synchronizer); see
  `fsdp_checkpoint_manager` for the three acts.

Worker compute methods return new tensors as a dict keyed by `Experience` field name
(`old_logps`, `ref_logps`, `values`), which `DataProto.union` adds to the batch.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from trainer.asynchronous.synchronizer import Synchronizer
from trainer.asynchronous.verl.data_proto import DataProto
from trainer.asynchronous.verl.dp_actor import DataParallelPPOActor, DataParallelPPOCritic
from trainer.asynchronous.verl.fsdp_checkpoint_manager import CheckpointMonitor, FSDPCheckpointManager
from trainer.config import OnlineStageConfig, PPOConfig
from trainer.errors import ConfigError
from trainer.lifecycle.context import RunContext
from trainer.modeling.models import load_causal_lm, load_frozen
from trainer.online.stages import boost_critic, boost_model_parts, load_critic_model, load_ptx_batches


class ActorRolloutRefWorker:
    """The trained policy (actor) and the frozen reference of the trainer process.

    Args:
        config: The stage config.
        context: The run context (booster, tokenizer, device).
        monitor: Joins this worker's checkpoints with the critic's.
        total_steps: Optimizer steps the learning-rate schedule spans.
        weights_dir: Where `save_state_dict` publishes versions.
        synchronizer: Where `upload_state_dict` puts versions (an explorer thread in this process).
    """

    def __init__(self, config: OnlineStageConfig, context: RunContext, monitor: CheckpointMonitor, total_steps: int,
                 weights_dir: str | None = None, synchronizer: Synchronizer | None = None) -> None:
        self.config = config
        self.context = context
        self.monitor = monitor
        self.total_steps = total_steps
        self.weights_dir = weights_dir
        self.synchronizer = synchronizer

    def init_model(self) -> None:
        """Load and boost the actor (with optimizer and schedule) and load the frozen reference.

        Under FSDP2 both load straight into shards (built on the meta device, each rank reading only
        its slices), as in the colocated loop; `Booster.boost` leaves the wrapped actor as it is.
        """
        context = self.context
        plugin = context.plugin
        model = load_causal_lm(self.config.model, plugin=plugin)
        parts = boost_model_parts(context.booster, model, self.config.optimizer, self.total_steps)
        self.actor = DataParallelPPOActor(context.booster, *parts, ptx_batches=load_ptx_batches(self.config, context))
        reference = load_frozen(load_causal_lm, self.config.model, plugin.device, plugin=plugin)
        self.ref_policy = DataParallelPPOActor(context.booster, reference)  # no optimizer: a reference
        self.checkpoint_manager = FSDPCheckpointManager("actor", context.booster, parts, self.monitor,
                                                        self.weights_dir, self.synchronizer)

    @property
    def module(self) -> torch.nn.Module:
        return self.actor.actor_module

    def setup_weight_sync_group(self) -> None:
        """Nothing to set up: there is no collective weight channel here (see the module docstring)."""

    def sync_weight(self) -> None:
        """The seed's collective ("nccl") weight broadcast, which this engine does not offer."""
        raise ConfigError("weights reach explorers through the weights directory (save_state_dict) or an "
                          "in-process Synchronizer (upload_state_dict); there is no collective weight channel")

    def upload_state_dict(self, trainer_step: int) -> None:
        self.checkpoint_manager.upload_state_dict(trainer_step)

    def save_state_dict(self, global_step: int) -> str | None:
        return self.checkpoint_manager.save_state_dict(global_step)

    def set_algorithm(self, config: OnlineStageConfig) -> None:
        self.actor.set_algorithm(config)

    def update_actor(self, data: DataProto, generator: torch.Generator) -> dict[str, float]:
        """Policy updates on the batch; metrics of `DataParallelPPOActor.update_policy`."""
        return self.actor.update_policy(data, generator)

    def compute_log_prob(self, data: DataProto) -> dict[str, Tensor]:
        """`old_logps`: the batch's log-probs under the current actor (the proximal policy)."""
        return {"old_logps": self.actor.compute_log_prob(data, self.config.train.micro_batch_size)}

    def compute_ref_log_prob(self, data: DataProto) -> dict[str, Tensor]:
        """`ref_logps`: the batch's log-probs under the frozen reference."""
        return {"ref_logps": self.ref_policy.compute_log_prob(data, self.config.train.micro_batch_size)}

    def save_checkpoint(self, global_step: int, state: dict[str, Any] | None = None, block: bool = False) -> None:
        self.checkpoint_manager.save_checkpoint(global_step, state, block)

    def load_checkpoint(self, directory: str) -> dict[str, Any]:
        return self.checkpoint_manager.load_checkpoint(directory)

    def clear_optimizer_state(self) -> None:
        """Forget the optimizer's moments (and gradients); parameters and schedule stay."""
        self.actor.actor_optimizer.state.clear()
        self.actor.actor_optimizer.zero_grad(set_to_none=True)

    def wait_on_save_thread(self) -> None:
        self.checkpoint_manager.wait_on_save_thread()


class CriticWorker:
    """PPO's value model in the trainer process.

    Args:
        config: A PPO config.
        context: The run context.
        monitor: Joins this worker's checkpoints with the actor's.
        total_steps: Optimizer steps the learning-rate schedule spans.
    """

    def __init__(self, config: PPOConfig, context: RunContext, monitor: CheckpointMonitor, total_steps: int) -> None:
        self.config = config
        self.context = context
        self.monitor = monitor
        self.total_steps = total_steps

    def init_model(self) -> None:
        """Load the critic and boost it on its own booster, with its optimizer at `ppo.critic_lr`.

        The critic's booster is built on the run's plugin (`boost_critic`), so under FSDP2 the critic
        loads straight into shards of that plugin.
        """
        model = load_critic_model(self.config, self.context.plugin)
        booster, parts = boost_critic(self.context, model, self.config, self.total_steps)
        self.critic = DataParallelPPOCritic(booster, *parts, config=self.config)
        self.checkpoint_manager = FSDPCheckpointManager("critic", booster, parts, self.monitor)

    @property
    def module(self) -> torch.nn.Module:
        return self.critic.critic_module

    def compute_values(self, data: DataProto) -> dict[str, Tensor]:
        """`values`: the critic's value before each response token."""
        return {"values": self.critic.compute_values(data, self.config.train.micro_batch_size)}

    def update_critic(self, data: DataProto, generator: torch.Generator) -> dict[str, float]:
        return self.critic.update_critic(data, generator)

    def save_checkpoint(self, global_step: int, block: bool = False) -> None:
        self.checkpoint_manager.save_checkpoint(global_step, None, block)

    def load_checkpoint(self, directory: str) -> dict[str, Any]:
        return self.checkpoint_manager.load_checkpoint(directory)

    def clear_optimizer_state(self) -> None:
        self.critic.critic_optimizer.state.clear()
        self.critic.critic_optimizer.zero_grad(set_to_none=True)

    def wait_on_save_thread(self) -> None:
        self.checkpoint_manager.wait_on_save_thread()
