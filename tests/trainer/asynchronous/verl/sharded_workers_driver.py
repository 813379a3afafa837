"""The verl workers on FSDP2 ranks: load into shards, log-probs and values, one update; each rank saves what it saw.

Usage: torchrun --nproc_per_node=2 sharded_workers_driver.py CONFIG_JSON DUMP_DIR

CONFIG_JSON is a PPO stage mapping with `parallel.plugin: fsdp2`. Rank r writes `<DUMP_DIR>/rank<r>.pt`:
`whole_loads` (the models `init_model` read whole), `shard_numel`/`full_numel`/`wrapped` per model
(actor, reference, critic), the batch and the
`old_logps`/`ref_logps`/`values` it computed (rank 1 holds more rows than rank 0, so its log-prob and
value passes take more micro-batches), `plain_logps` (the same batch through a model loaded whole),
`unequal_update_error` (the refusal of an update over unequal batches), and the gathered full
actor, reference and critic states `before` and `after` one update on equal batches.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from trainer.algorithms.online.registry import online_algorithm
from trainer.algorithms.ppo import response_logps
from trainer.asynchronous.verl.data_proto import DataProto
from trainer.asynchronous.verl.fsdp_checkpoint_manager import CheckpointMonitor
from trainer.asynchronous.verl.fsdp_workers import ActorRolloutRefWorker, CriticWorker
from trainer.checkpointing.checkpoint import CheckpointManager
from trainer.config import build_config
from trainer.errors import TrainingError
from trainer.lifecycle.context import build_context
from trainer.modeling.models import load_causal_lm
from trainer.rollout.experience import Experience

FULL_ON_EVERY_RANK = StateDictOptions(full_state_dict=True)  # no cpu_offload: every rank gets the full tensors


def make_data(vocab_size: int, rows: int, seed: int) -> DataProto:
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(3, vocab_size, (rows, 6), generator=generator)  # 2 prompt, 4 response tokens
    action_mask = torch.tensor([[0, 0, 1, 1, 1, 1]] * rows)
    batch = Experience(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), action_mask=action_mask,
                       position_ids=torch.arange(6).repeat(rows, 1), scores=(torch.arange(rows) % 2).float())
    return DataProto(batch, {"model_versions": torch.zeros(rows, dtype=torch.long)})


@contextlib.contextmanager
def counting_whole_loads() -> Iterator[list[str]]:
    """Records each `from_pretrained` (a whole model read into one process) while the block runs; the
    sharded path builds on the meta device and reads slices instead."""
    from transformers import PreTrainedModel

    original = PreTrainedModel.__dict__["from_pretrained"]
    loads: list[str] = []

    def from_pretrained(cls, *args, **kwargs):
        loads.append(cls.__name__)
        return original.__func__(cls, *args, **kwargs)

    PreTrainedModel.from_pretrained = classmethod(from_pretrained)
    try:
        yield loads
    finally:
        PreTrainedModel.from_pretrained = original


def shard_facts(plugin, model: torch.nn.Module) -> dict:
    local = sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel() for p in model.parameters())
    full = sum(p.numel() for p in model.parameters())  # a DTensor's numel is its global size
    return {"shard_numel": local, "full_numel": full, "wrapped": plugin.is_wrapped(model)}


def full_states(actor: ActorRolloutRefWorker, critic: CriticWorker) -> dict:
    return {name: {k: v.detach().cpu().clone() for k, v in get_model_state_dict(model, options=FULL_ON_EVERY_RANK).items()}
            for name, model in (("actor", actor.module), ("reference", actor.ref_policy.actor_module),
                                ("critic", critic.module))}


def main() -> None:
    config_path, dump_dir = sys.argv[1:3]
    with open(config_path) as file:
        config = build_config("ppo", json.load(file))
    context = build_context(config)
    rank = context.env.rank
    monitor = CheckpointMonitor(CheckpointManager(context.checkpoint_root(), context.booster), {"actor", "critic"})
    actor = ActorRolloutRefWorker(config, context, monitor, total_steps=10)
    critic = CriticWorker(config, context, monitor, total_steps=10)
    with counting_whole_loads() as whole_loads:
        actor.init_model()
        critic.init_model()
    actor.set_algorithm(config)
    models = {"actor": actor.module, "reference": actor.ref_policy.actor_module, "critic": critic.module}
    dump: dict = {"models": {name: shard_facts(context.plugin, model) for name, model in models.items()},
                  "whole_loads": list(whole_loads)}

    vocab_size = actor.module.config.vocab_size
    # Unequal batches (4 and 6 rows, micro-batches of 2): 2 and 3 forwards unless the workers even them out.
    data = make_data(vocab_size, 4 + 2 * rank, seed=rank)
    data = data.union(actor.compute_log_prob(data)).union(actor.compute_ref_log_prob(data))
    data = data.union(critic.compute_values(data))
    plain = load_causal_lm(config.model).eval()  # the same weights, loaded whole on this rank alone
    with torch.no_grad():
        dump["plain_logps"] = response_logps(plain, data.batch.as_batch()) * data.batch.action_mask
    dump["batch"] = data.batch
    data = DataProto(online_algorithm(config).compute_advantages(data.batch, kl_coef=0.05), data.meta_info)
    try:
        actor.update_actor(data, torch.Generator().manual_seed(0))
    except TrainingError as err:
        dump["unequal_update_error"] = str(err)

    # An update over equal batches (4 rows each, different rows per rank).
    equal = make_data(vocab_size, 4, seed=10 + rank)
    equal = equal.union(actor.compute_log_prob(equal)).union(actor.compute_ref_log_prob(equal))
    equal = equal.union(critic.compute_values(equal))
    equal = DataProto(online_algorithm(config).compute_advantages(equal.batch, kl_coef=0.05), equal.meta_info)
    dump["before"] = full_states(actor, critic)
    dump["critic_metrics"] = critic.update_critic(equal, torch.Generator().manual_seed(1))
    dump["actor_metrics"] = actor.update_actor(equal, torch.Generator().manual_seed(1))
    dump["after"] = full_states(actor, critic)
    torch.save(dump, f"{dump_dir}/rank{rank}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
