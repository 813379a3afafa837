"""The verl workers under `parallel.plugin: fsdp2` on 2 gloo ranks (`sharded_workers_driver.py`).

Actor, reference and critic load straight into shards (no rank holds any of them whole); the
sharded log-probs equal those of a model loaded whole, the untrained actor's equal the reference's;
ranks with unequal batches still run their forwards in step (the driver would hang otherwise), an
update over unequal batches is refused on every rank, and one over equal batches leaves the
same full weights on both ranks while the reference stays as it was.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from tests.conftest import stage_dict
from tests.integration.services import free_port

DRIVER = Path(__file__).with_name("sharded_workers_driver.py")
REPOSITORY = Path(__file__).parents[4]


def test_workers_load_into_shards_and_stay_in_step_across_ranks(tmp_path, tiny_model, task_files):
    config = stage_dict("ppo", tmp_path / "run", tiny_model, task_files["prompts"], train={"micro_batch_size": 2},
                        optimizer={"lr": 1e-2, "scheduler": "constant"}, parallel={"plugin": "fsdp2"},
                        reward={"function": "trainer.tiny.task:reward"},
                        ppo={"rollout_batch_size": 4, "mini_batch_size": 4})
    config_path = tmp_path / "config.json"
    config_path.write_text(json.dumps(config))
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
               f"--master_port={free_port()}", str(DRIVER), str(config_path), str(tmp_path)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPOSITORY)}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ranks = [torch.load(tmp_path / f"rank{rank}.pt", weights_only=False) for rank in range(2)]

    assert [dump["whole_loads"] for dump in ranks] == [[], []]  # no model was read whole on any rank
    for name in ("actor", "reference", "critic"):  # each rank holds about half of each model, never all of it
        facts = [dump["models"][name] for dump in ranks]
        assert all(fact["wrapped"] for fact in facts), name
        assert sum(fact["shard_numel"] for fact in facts) == facts[0]["full_numel"], name
        assert max(fact["shard_numel"] for fact in facts) <= 0.55 * facts[0]["full_numel"], name

    for rank, dump in enumerate(ranks):
        batch = dump["batch"]
        assert len(batch) == 4 + 2 * rank  # rank 1 ran 3 micro-batches to rank 0's 2 (plus 1 stand-in)
        torch.testing.assert_close(batch.old_logps, dump["plain_logps"], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(batch.ref_logps, batch.old_logps, rtol=0, atol=0)  # untrained actor = reference
        assert batch.old_logps[:, :2].abs().sum() == 0 and batch.old_logps[:, 2:].abs().sum() > 0
        assert batch.values.shape == (4 + 2 * rank, 6) and batch.values[:, :2].abs().sum() == 0
        assert "hold 4 to 6 rows" in dump["unequal_update_error"]
        assert dump["actor_metrics"]["num_optimizer_steps"] == 1
        assert dump["critic_metrics"]["critic/num_optimizer_steps"] == 1

    for name in ("actor", "reference", "critic"):
        before, after = ranks[0]["before"][name], ranks[0]["after"][name]
        for key in after:  # both ranks gathered the same full weights after the update
            torch.testing.assert_close(ranks[1]["after"][name][key], after[key], rtol=0, atol=0, msg=f"{name} {key}")
        changed = any(not torch.equal(before[key], after[key]) for key in after)
        assert changed == (name != "reference"), name  # actor and critic trained; the reference stayed frozen
