"""Sharded (FSDP2, DCP) checkpoints: every rank writes its own shards, and a run resumes on another world size.

The torchrun tests run 2 CPU processes on gloo (`sharded_driver.py`). The SFT task has 80 rows; a
global batch of 20 (micro-batch 5 x accumulation 2 x 2 ranks, or 10 x 2 x 1) is 4 steps an epoch.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from tests.conftest import stage_dict
from tests.integration.services import S3_ENV, free_port, start_moto, stop
from trainer.checkpointing.checkpoint import CheckpointManager
from trainer.checkpointing.sharded import read_metadata
from trainer.config import build_config
from trainer.errors import CheckpointError
from trainer.lifecycle.resume import check_belongs
from trainer.modeling.models import load_causal_lm
from trainer.modeling.optim import build_optimizer, build_scheduler
from trainer.parallel.booster import Booster, SinglePlugin
from trainer.runtime import DistributedEnv
from trainer.supervised.stages import run_stage

DRIVER = Path(__file__).with_name("sharded_driver.py")
FETCH_DRIVER = Path(__file__).with_name("fetch_agreement_driver.py")
REPOSITORY = Path(__file__).parents[3]


def sft_config(output_dir: str | Path, tiny_model: Path, task_files: dict, micro_batch_size: int,
               plugin: str) -> dict:
    return stage_dict("sft", output_dir, tiny_model, task_files["sft_train"],
                      train={"micro_batch_size": micro_batch_size, "gradient_accumulation_steps": 2},
                      parallel={"plugin": plugin})


@pytest.fixture
def bucket(tmp_path, monkeypatch):
    """A bucket on a moto S3 server of this test's own; the AWS environment points at it for the test only."""
    import boto3

    from trainer.storage.s3 import S3Storage

    process, endpoint = start_moto(tmp_path)
    for key, value in {**S3_ENV, "AWS_ENDPOINT_URL": endpoint}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(S3Storage, "_shared", None)  # a client made before would point elsewhere
    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="sharded")
    yield "sharded"
    stop(process)


def torchrun(config: dict, dump_dir: Path, stop_after: int | None = None) -> dict[str, torch.Tensor]:
    """Run the SFT stage on 2 gloo ranks; rank 0's full parameters at the end."""
    dump_dir.mkdir(parents=True, exist_ok=True)
    config_path = dump_dir / "sft.yaml"
    config_path.write_text(yaml.safe_dump(config))
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
               f"--master_port={free_port()}", str(DRIVER), str(config_path), str(dump_dir)]
    command += [str(stop_after)] if stop_after is not None else []
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPOSITORY)}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return torch.load(dump_dir / "params.pt")


def test_fsdp2_checkpoint_is_written_in_shards_and_resumes_on_one_process(tmp_path, tiny_model, task_files):
    output = tmp_path / "two-then-one"
    at_stop = torchrun(sft_config(output, tiny_model, task_files, 5, "fsdp2"), tmp_path / "dump", stop_after=2)
    checkpoint = output / "checkpoints" / "step-00000002"

    # Each rank wrote its own slice of the model and of AdamW's state; no rank wrote (or held) it all.
    shards = {path.name: path.stat().st_size for path in (checkpoint / "model.dcp").glob("*.distcp")}
    assert sorted(shards) == ["__0_0.distcp", "__1_0.distcp"]
    assert max(shards.values()) < 0.6 * sum(shards.values())
    assert not (checkpoint / "model.pt").exists() and not (checkpoint / "model.optimizer.pt").exists()
    manifest = json.loads((checkpoint / "manifest.json").read_text())
    assert manifest["format"] == "dcp" and manifest["world_size"] == 2
    assert manifest["files"]["model.dcp/__1_0.distcp"] == shards["__1_0.distcp"]  # rank 1's file, listed by rank 0

    # One process without a process group loads the 2-rank checkpoint: the same parameters, resharded.
    config = build_config("sft", sft_config(output, tiny_model, task_files, 10, "single"))
    model = load_causal_lm(config.model)
    optimizer = build_optimizer(model, config.optimizer)
    scheduler = build_scheduler(optimizer, config.optimizer, 4)
    manager = CheckpointManager(output / "checkpoints", Booster(SinglePlugin(DistributedEnv(0, 0, 1), torch.device("cpu"))))
    state = manager.load(str(checkpoint), {"model": (model, optimizer, scheduler)})
    assert state["global_step"] == 2 and state["samples_in_epoch"] == 40
    assert manager.shard_files_read["model"] == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    loaded = model.state_dict()
    assert loaded.keys() == at_stop.keys()
    for key in at_stop:
        torch.testing.assert_close(loaded[key], at_stop[key], rtol=0, atol=0, msg=key)
    assert all(len(optimizer.state[p]) == 3 for p in model.parameters())  # step, exp_avg, exp_avg_sq restored

    # The same global batch on 1 process (micro-batch 10) continues the run where the 2 ranks stopped:
    # it ends where an uninterrupted 1-process run ends (2-rank and 1-process steps agree to float error).
    run_stage(build_config("sft", sft_config(output, tiny_model, task_files, 10, "single")))
    run_stage(build_config("sft", sft_config(tmp_path / "straight", tiny_model, task_files, 10, "single")))
    resumed = load_file(output / "model" / "model.safetensors")
    straight = load_file(tmp_path / "straight" / "model" / "model.safetensors")
    for key in straight:
        torch.testing.assert_close(resumed[key], straight[key], rtol=1e-4, atol=1e-5, msg=key)
    assert not torch.allclose(resumed["model.embed_tokens.weight"], at_stop["model.embed_tokens.weight"])


def test_a_rank_that_cannot_fetch_its_files_fails_every_rank_before_the_collective_load(tmp_path):
    # In production one rank's download runs out of retries; here rank 1 is pointed at a checkpoint
    # without its training state. Had rank 1 left alone, rank 0 would wait in DCP's load until the
    # process group timed out (the subprocess timeout below would fail this test).
    whole, broken = tmp_path / "whole", tmp_path / "broken"
    whole.mkdir()
    broken.mkdir()
    (whole / "trainer_state.json").write_text(json.dumps({"global_step": 2}))
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
               f"--master_port={free_port()}", str(FETCH_DRIVER), str(whole), str(broken), str(tmp_path)]
    done = subprocess.run(command, env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPOSITORY)},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert (tmp_path / "rank0.txt").read_text() == f"CheckpointError: {whole}: another rank could not fetch its files"
    assert (tmp_path / "rank1.txt").read_text().startswith(
        f"CheckpointError: {broken}: rank 1 could not fetch its files: ")


def test_fsdp2_checkpoint_in_s3_resumes_with_each_rank_reading_only_its_shards(tmp_path, tiny_model, task_files,
                                                                               bucket):
    output = f"s3://{bucket}/sft"
    config = sft_config(output, tiny_model, task_files, 5, "fsdp2")
    torchrun(config, tmp_path / "first", stop_after=2)
    final = torchrun(config, tmp_path / "second")

    read = [json.loads((tmp_path / "second" / f"read-rank{rank}.json").read_text())["model"] for rank in (0, 1)]
    assert "__0_0.distcp" in read[0] and "__1_0.distcp" in read[1]
    assert "__0_0.distcp" not in read[1]  # rank 1's slices lie in its own file: rank 0's is never downloaded
    assert final.keys() and all(torch.isfinite(value).all() for value in final.values())


def manifest_of(world_size: int, micro_batch_size: int, accumulation: int, format: str = "dcp") -> dict:
    return {"format": format, "world_size": world_size,
            "fingerprint": {"stage": "sft", "train.micro_batch_size": micro_batch_size,
                            "train.gradient_accumulation_steps": accumulation}}


def fingerprint_of(micro_batch_size: int, accumulation: int) -> dict:
    return manifest_of(1, micro_batch_size, accumulation)["fingerprint"]


SUPERVISED_STATE = {"global_step": 2, "samples_in_epoch": 40}


def test_sharded_checkpoint_resumes_on_another_world_size_only_with_the_same_global_batch():
    # 2 x 5 x 2 = 20 = 1 x 10 x 2: allowed.
    check_belongs("ckpt", manifest_of(2, 5, 2), SUPERVISED_STATE, fingerprint_of(10, 2), 1, group_by_length=True)
    # 2 x 5 x 2 = 20 = 1 x 5 x 4: allowed without length grouping (its windows are micro-batch x ranks).
    check_belongs("ckpt", manifest_of(2, 5, 2), SUPERVISED_STATE, fingerprint_of(5, 4), 1)
    with pytest.raises(CheckpointError, match=r"micro_batch_size x processes must stay 10 \(it is 5\)"):
        check_belongs("ckpt", manifest_of(2, 5, 2), SUPERVISED_STATE, fingerprint_of(5, 4), 1, group_by_length=True)
    with pytest.raises(CheckpointError, match=r"its global batch was 20 \(micro_batch_size 5 x gradient_accumulation"
                                              r"_steps 2 x 2\), this run's is 10 \(5 x 2 x 1\)"):
        check_belongs("ckpt", manifest_of(2, 5, 2), SUPERVISED_STATE, fingerprint_of(5, 2), 1)


def test_changed_world_size_is_still_refused_for_full_and_online_checkpoints():
    with pytest.raises(CheckpointError, match=r"written by 2 data-parallel process\(es\), this run has 1"):
        check_belongs("ckpt", manifest_of(2, 5, 2, format="full"), SUPERVISED_STATE, fingerprint_of(5, 2), 1)
    with pytest.raises(CheckpointError, match=r"written by 2 data-parallel process\(es\), this run has 1"):
        check_belongs("ckpt", manifest_of(2, 5, 2), {"episode": 3}, fingerprint_of(5, 2), 1)  # online: no sample count
    with pytest.raises(CheckpointError, match=r"belongs to another run: train.micro_batch_size is 5 there, 10 here"):
        check_belongs("ckpt", manifest_of(1, 5, 2), SUPERVISED_STATE, fingerprint_of(10, 2), 1)  # same world size


class _Planted:
    def __reduce__(self):
        return (os.system, ("echo planted",))


def test_planted_dcp_metadata_is_refused_not_unpickled(tmp_path):
    path = tmp_path / ".metadata"
    path.write_bytes(pickle.dumps(_Planted()))
    with pytest.raises(CheckpointError, match=r"\.metadata: not a DCP metadata file \(posix\.system is not part"):
        read_metadata(path)


def test_online_stage_with_a_sharded_checkpoint_of_another_world_size_is_one_refusal(tmp_path, tiny_model, task_files):
    from tests.conftest import make_config
    from trainer.checkpointing.checkpoint import LATEST
    from trainer.lifecycle.resume import run_fingerprint, vet_output_dir
    from trainer.storage import get_storage
    from trainer.storage.pointer import write_pointer

    config = make_config("ppo", tmp_path / "out", tiny_model, task_files["prompts"],
                         reward={"function": "trainer.tiny.task:reward"}, parallel={"plugin": "fsdp2"})
    root = tmp_path / "out" / "checkpoints"
    step = root / "step-00000002"
    step.mkdir(parents=True)
    (step / "manifest.json").write_text(json.dumps({"files": {}, "format": "dcp", "world_size": 2,
                                                    "fingerprint": run_fingerprint(config, "ppo")}))
    (step / "trainer_state.json").write_text(json.dumps({"episode": 2}))
    write_pointer(get_storage(str(root)), str(root), LATEST, step.name)
    manager = CheckpointManager(root, Booster(SinglePlugin(DistributedEnv(0, 0, 1), torch.device("cpu"))))
    with pytest.raises(CheckpointError, match=r"written by 2 data-parallel process\(es\), this run has 1: the global"):
        vet_output_dir(config, "ppo", manager, 1)


def test_shards_round_trip_in_one_process_with_hyper_parameters_read_as_plain_data(tmp_path):
    from trainer.checkpointing.sharded import StorageShardReader, read_shards, write_shards

    torch.manual_seed(0)
    model, restored = torch.nn.Linear(4, 3), torch.nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.125, betas=(0.8, 0.9))
    model(torch.ones(2, 4)).sum().backward()
    optimizer.step()
    write_shards(model, optimizer, tmp_path / "model.dcp")  # no process group: DCP runs as one rank

    other = torch.optim.AdamW(restored.parameters(), lr=1.0)
    reader = StorageShardReader(f"file://{tmp_path / 'model.dcp'}", tmp_path / "unused")
    read_shards(restored, other, reader)
    assert torch.equal(restored.weight, model.weight) and torch.equal(restored.bias, model.bias)
    assert torch.equal(other.state[restored.weight]["exp_avg"], optimizer.state[model.weight]["exp_avg"])
    # lr and betas are not tensors: DCP stores them as bytes, read back with torch.load(weights_only=True).
    assert other.param_groups[0]["lr"] == 0.125 and tuple(other.param_groups[0]["betas"]) == (0.8, 0.9)
    assert reader.files_read == {".metadata", "__0_0.distcp"}


def test_a_sharded_save_that_cannot_write_is_one_error_and_moves_no_pointer(tmp_path, caplog):
    from trainer.parallel.booster import FSDP2Plugin

    (tmp_path / "blocked").write_text("a file where the checkpoint root's parent directory should be")
    root = tmp_path / "blocked" / "checkpoints"
    # The FSDP2 plugin picks the sharded path; DCP needs no process group for a plain module.
    manager = CheckpointManager(root, Booster(FSDP2Plugin(DistributedEnv(0, 0, 1), torch.device("cpu"))))
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(model.parameters())
    components = {"model": (model, optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0))}
    with pytest.raises(CheckpointError, match=r"checkpoint step-00000001 could not be saved to .*blocked/checkpoints: "
                                              r".*; last durable checkpoint: none"):
        manager.save(components, {"global_step": 1}, 1)
    manager.save(components, {"global_step": 2}, 2, block=False)  # a mid-run save: logged, training goes on
    assert "checkpoint step-00000002 could not be saved" in caplog.text
    assert manager.last_durable is None and manager.latest() is None
