"""Data parallelism on 2 CPU processes (torchrun, gloo): ranks agree, and match one process.

One process with micro-batch 2b takes the same optimizer steps as two processes with b each (see
`algorithms/update.py` for the loss normalisation and `ResumableSampler` for the sample split).
"""

from __future__ import annotations

import os
import re
import string
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from tests.conftest import stage_dict
from tests.integration.services import free_port
from trainer.config import build_config
from trainer.supervised.stages import run_stage

DRIVER = Path(__file__).with_name("torchrun_stage.py")


def run_torchrun(stage: str, config: dict, directory: Path, suffix: str = "") -> list[dict[str, torch.Tensor]]:
    config_path = directory / f"{stage}.yaml"
    config_path.write_text(yaml.safe_dump(config))
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
               f"--master_port={free_port()}", str(DRIVER), stage, str(config_path), str(directory)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).parents[2])}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    (directory / f"{stage}{suffix}.log").write_text(done.stdout + done.stderr)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return [torch.load(directory / f"rank{rank}{suffix}.pt") for rank in range(2)]


def run_single(stage: str, config: dict) -> dict[str, torch.Tensor]:
    result = run_stage(build_config(stage, config))
    return {k: v.detach().clone() for k, v in result.model.state_dict().items()}


def assert_states_close(left: dict, right: dict, **tolerance) -> None:
    assert left.keys() == right.keys()
    for key in left:
        torch.testing.assert_close(left[key], right[key], msg=lambda m, key=key: f"{key}: {m}", **tolerance)


@pytest.mark.parametrize("plugin", ["ddp", "fsdp2"])
def test_two_ranks_agree_and_match_one_process_sft(plugin, tmp_path, tiny_model, task_files):
    def config(name: str, micro_batch_size: int, plugin_name: str) -> dict:
        return stage_dict("sft", tmp_path / name, tiny_model, task_files["sft_train"],
                          train={"micro_batch_size": micro_batch_size, "gradient_accumulation_steps": 2},
                          parallel={"plugin": plugin_name})

    rank0, rank1 = run_torchrun("sft", config("two", 5, plugin), tmp_path)
    single = run_single("sft", config("one", 10, "single"))

    initial = load_file(tiny_model / "model.safetensors")

    assert_states_close(rank0, rank1, rtol=0, atol=0)
    assert_states_close(rank0, single, rtol=1e-4, atol=1e-5)
    # Training really moved the weights, so agreement is not agreement of untouched copies.
    assert not torch.allclose(rank0["model.embed_tokens.weight"], initial["model.embed_tokens.weight"], atol=1e-3)
    assert (tmp_path / "two" / "model" / "config.json").is_file()


def test_two_ranks_agree_and_match_one_process_dpo_with_precomputed_reference(tmp_path, tiny_model, task_files):
    def config(name: str, micro_batch_size: int, plugin_name: str) -> dict:
        return stage_dict("dpo", tmp_path / name, tiny_model, task_files["pref_eval"],
                          train={"micro_batch_size": micro_batch_size}, parallel={"plugin": plugin_name},
                          dpo={"precompute_ref_log_probs": True})

    rank0, rank1 = run_torchrun("dpo", config("two", 5, "ddp"), tmp_path)
    single = run_single("dpo", config("one", 10, "single"))

    assert_states_close(rank0, rank1, rtol=0, atol=0)
    assert_states_close(rank0, single, rtol=1e-4, atol=1e-5)


# Half the tiny vocabulary stops a response, so each rank's rows all end after a different number of
# tokens: a sharded actor must keep stepping (synced_gpus) until every rank's have, or generation hangs.
STOP_OFTEN = list(string.ascii_letters)


@pytest.mark.parametrize("stage", ["ppo", "grpo"])
def test_online_stage_loads_every_model_into_shards_under_fsdp2_and_matches_ddp(stage, tmp_path, tiny_model, task_files):
    from tests.trainer.modeling.test_value_heads import sequence_classifier

    # A reward model from a path (its random head scores every response differently, so GRPO's groups
    # have advantages where the untrained model's all-wrong answers would have none), a reference for
    # PPO's KL penalty and GRPO's beta > 0, and PPO's critic, loaded from the reward model.
    sequence_classifier(tiny_model, tmp_path / "rm")
    algorithm = {"num_episodes": 2, "rollout_batch_size": 8, "mini_batch_size": 4}
    options = {"ppo": {"ppo": {**algorithm, "critic_lr": 1e-3, "kl_coef": 0.1}},
               "grpo": {"grpo": {**algorithm, "rollout_batch_size": 2, "num_generations": 4, "beta": 0.1}}}[stage]

    def config(name: str, plugin: str) -> dict:
        return stage_dict(stage, tmp_path / name, tiny_model, task_files["prompts"],
                          optimizer={"lr": 1e-3, "scheduler": "constant"}, train={"micro_batch_size": 4},
                          generation={"max_new_tokens": 8, "stop": STOP_OFTEN}, parallel={"plugin": plugin},
                          reward={"model_path": str(tmp_path / "rm")}, **options)

    dumps = {plugin: tmp_path / f"dump-{plugin}" for plugin in ("fsdp2", "ddp")}
    for directory in dumps.values():
        directory.mkdir()
    sharded = run_torchrun(stage, config("fsdp2", "fsdp2"), dumps["fsdp2"])
    whole = run_torchrun(stage, config("ddp", "ddp"), dumps["ddp"])
    log = (dumps["fsdp2"] / f"{stage}.log").read_text()
    initial = load_file(tiny_model / "model.safetensors")

    # Every model the stage builds was loaded into shards, none whole on every rank: the actor and the
    # reference (both model.path), the reward model and PPO's critic.
    loaded = Counter(re.findall(r"sharded_load: (\S+): loaded \S+ into shards", log))
    critic = {"ppo.critic_model_path": loaded["reward.model_path"]} if stage == "ppo" else {}
    assert loaded["reward.model_path"] > 0
    assert loaded == Counter({"model.path": 2 * loaded["reward.model_path"], "reward.model_path": loaded["reward.model_path"],
                              **critic})
    assert "loads it whole" not in log
    for dump, states in ((dumps["fsdp2"], sharded), (dumps["ddp"], whole)):  # every rank holds the same actor
        assert_states_close(states[0], states[1], rtol=0, atol=0)
        if stage == "ppo":  # and the same critic
            critics = [torch.load(dump / f"rank{rank}-critic.pt") for rank in range(2)]
            assert_states_close(critics[0], critics[1], rtol=0, atol=0)
    # Same sampling seeds per rank and the same gradients: the sharded run is the whole-model run.
    assert_states_close(sharded[0], whole[0], rtol=1e-4, atol=1e-5)
    if stage == "ppo":
        critics = [torch.load(dumps[plugin] / "rank0-critic.pt") for plugin in ("fsdp2", "ddp")]
        assert_states_close(*critics, rtol=1e-4, atol=1e-5)
    assert not torch.allclose(sharded[0]["lm_head.weight"], initial["lm_head.weight"])
