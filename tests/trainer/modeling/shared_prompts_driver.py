"""Half of a grouped batch per rank, scored through the shared prompt forward of a DDP-wrapped tiny Llama.

Usage: torchrun --nproc_per_node=2 shared_prompts_driver.py DUMP_FILE

Each rank backpropagates the sum of its rows' response log-probs (DDP averages the two gradients); rank 0
writes every rank's reduced gradient and the batch sizes of its model's forwards to DUMP_FILE for
`test_shared_prompts.py`.
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist

from tests.trainer.modeling.test_shared_prompts import grouped_batch, shared_calls
from trainer.algorithms.ppo import response_logps
from trainer.parallel.booster import DDPPlugin
from trainer.runtime import init_process_group, pick_device, read_distributed_env
from trainer.tiny.model import build_tiny_llama


def main() -> None:
    env = read_distributed_env()
    device = pick_device(env)
    init_process_group(env, device)
    inner = build_tiny_llama(40, seed=1)
    sizes = shared_calls(inner)
    model = DDPPlugin(env, device).wrap_model(inner)
    rows = slice(6 * env.rank, 6 * env.rank + 6)
    batch = {name: tensor[rows] for name, tensor in grouped_batch(generations=4).items()}
    (response_logps(model, batch) * batch["action_mask"]).sum().backward()  # DDP averages the ranks
    gradients = [p.grad.detach().clone() for p in inner.parameters()]
    everything = [None, None]
    dist.all_gather_object(everything, {"gradients": gradients, "sizes": sizes})
    if env.rank == 0:
        torch.save({"gradients": [rank["gradients"] for rank in everything],
                    "forward_sizes": [rank["sizes"] for rank in everything]}, sys.argv[1])
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
