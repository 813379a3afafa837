"""One `train_step` per objective on 2 gloo ranks, each with half of a global batch in 2 micro-batches.

Usage: torchrun --nproc_per_node=2 ranks_driver.py DUMP_FILE

Rank 0 writes, per case, the step's logged loss and the parameter change of an SGD step with lr 1
(the negative of the averaged gradient; no clipping) to DUMP_FILE, and the KTO reference point each rank
used. `test_two_ranks.py` compares them with one process computing the objective on the whole batch at once.
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist

from tests.trainer.algorithms.stand_ins import BigramLM
from tests.trainer.algorithms.two_rank_cases import CASES, POLICY_WEIGHTS, kto_objective, kto_rank_batch, split_rows
from trainer.algorithms.update import train_step
from trainer.parallel.booster import Booster, DDPPlugin
from trainer.runtime import init_process_group, pick_device, read_distributed_env


def main() -> None:
    dump_file = sys.argv[1]
    env = read_distributed_env()
    device = pick_device(env)
    init_process_group(env, device)
    results = {}
    for name, (objective, batch, unit) in CASES.items():
        booster = Booster(DDPPlugin(env, device))
        model, optimizer, scheduler = booster.boost_with_optimizer(
            BigramLM(POLICY_WEIGHTS), lambda m: torch.optim.SGD(m.parameters(), lr=1.0),
            lambda o: torch.optim.lr_scheduler.LambdaLR(o, lambda step: 1.0))
        before = model.module.table.weight.detach().clone()
        rows = split_rows(batch, unit)  # 4 rows (or pairs): rank r trains on r*2 and r*2+1, one per micro-batch
        mine = rows[2 * env.rank: 2 * env.rank + 2]
        metrics = train_step(booster, model, optimizer, scheduler, mine, objective, max_grad_norm=0.0)
        results[name] = {"loss": metrics["loss"], "delta": model.module.table.weight.detach() - before}
    z0 = kto_objective().reference_point(BigramLM(POLICY_WEIGHTS), kto_rank_batch(env.rank))
    every_rank_z0 = [torch.zeros(()) for _ in range(env.world_size)]
    dist.all_gather(every_rank_z0, z0)
    results["kto_z0"] = torch.stack(every_rank_z0)
    if env.is_main_process:
        torch.save(results, dump_file)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
