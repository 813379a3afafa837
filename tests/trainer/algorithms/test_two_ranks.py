"""Gradient accumulation and 2 ranks give the loss and the gradient of one big batch, for every GRPO loss type
whose normaliser spans the global batch, a DPO loss list and ORPO (`bnpo` is a local mean by definition:
`test_grpo.py`); and KTO's reference point is one estimate over both ranks. The 2 ranks are real: torchrun,
gloo, DDP, and `train_step`'s all-reduce of the units."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.integration.services import free_port
from tests.trainer.algorithms.stand_ins import BigramLM
from tests.trainer.algorithms.two_rank_cases import CASES, POLICY_WEIGHTS

DRIVER = Path(__file__).with_name("ranks_driver.py")
REPOSITORY = Path(__file__).parents[3]


@pytest.fixture(scope="module")
def two_rank_results(tmp_path_factory):
    dump = tmp_path_factory.mktemp("ranks") / "results.pt"
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
               f"--master_port={free_port()}", str(DRIVER), str(dump)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPOSITORY)}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return torch.load(dump)


@pytest.mark.parametrize("case", CASES)
def test_two_ranks_with_accumulation_match_one_process_on_the_whole_batch(case, two_rank_results):
    objective, batch, _ = CASES[case]
    model = BigramLM(POLICY_WEIGHTS)
    output = objective(model, batch)
    (output.total / output.count).backward()
    ranks = two_rank_results[case]
    torch.testing.assert_close(torch.tensor(ranks["loss"]), (output.total / output.count).detach(), msg=case)
    torch.testing.assert_close(ranks["delta"], -model.table.weight.grad, msg=case)  # SGD with lr 1: -gradient


def test_kto_reference_point_is_the_mean_over_both_ranks_then_clamped(two_rank_results):
    # Rank 0's mismatched pairs have log-ratio -log 2 each, rank 1's log 5/2 (two_rank_cases): alone, rank 0 would
    # use z0 = 0 and rank 1 log 5/2; averaging the clamped values would give log(5/2) / 2.
    expected = (math.log(5 / 2) - math.log(2)) / 2
    torch.testing.assert_close(two_rank_results["kto_z0"], torch.tensor([expected, expected]))
