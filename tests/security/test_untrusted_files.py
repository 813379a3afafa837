"""Files read back from shared storage cannot run code (issue 11, item 2).

Whoever can write a run's checkpoint, buffer or weights prefix plants a pickle that would run
`touch <marker>` when loaded. Every case asserts the marker was never created and that the error
is an alignflow error naming the planted file. With `torch.load(weights_only=False)`, as before,
the resume and the buffer read ran the command.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from tests.conftest import stage_dict
from tests.security.payloads import code_running_torch_file
from trainer.asynchronous.buffer import FileBuffer
from trainer.asynchronous.weights import load_version, publish_weights
from trainer.checkpointing.checkpoint import CheckpointManager, TrainerState
from trainer.errors import CheckpointError, DataError
from trainer.parallel.booster import Booster, SinglePlugin
from trainer.rollout.experience import Experience
from trainer.runtime import DistributedEnv

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def marker(tmp_path) -> Path:
    path = tmp_path / "code-ran"
    yield path
    assert not path.exists(), "the planted pickle ran its command"


def saved_checkpoint(root: Path):
    """A real checkpoint of a small model at step 3; returns (manager, components, its directory)."""
    booster = Booster(SinglePlugin(DistributedEnv(0, 0, 1), torch.device("cpu")))
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    booster.register_optimizer(model, optimizer)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    manager = CheckpointManager(root, booster)
    components = {"model": (model, optimizer, scheduler)}
    manager.save(components, TrainerState(global_step=3), 3)
    return manager, components, Path(manager.latest())


def test_planted_pickled_rng_state_is_refused_not_run(tmp_path, marker):
    # The probe: a checkpoint whose RNG state is the pickle `rng-rank0.pt`.
    manager, components, directory = saved_checkpoint(tmp_path / "checkpoints")
    for existing in directory.glob("rng-rank0.*"):
        existing.unlink()
    (directory / "rng-rank0.pt").write_bytes(code_running_torch_file(marker))
    with pytest.raises(CheckpointError, match=r"rng-rank0\.pt.*not loaded"):
        manager.load(str(directory), components)


def test_crafted_rng_state_file_is_refused_not_run(tmp_path, marker):
    manager, components, directory = saved_checkpoint(tmp_path / "checkpoints")
    written = list(directory.glob("rng-rank0.*"))
    assert written, "the checkpoint holds this rank's RNG state"
    for path in written:  # whatever name and format the checkpoint uses, the attacker overwrites it
        path.write_bytes(code_running_torch_file(marker))
    with pytest.raises(CheckpointError, match=r"rng-rank0\.") as raised:
        manager.load(str(directory), components)
    assert str(directory) in str(raised.value)


@pytest.mark.parametrize("name", ["model.pt", "model.optimizer.pt", "model.scheduler.pt", "trainer_state.json"])
def test_crafted_checkpoint_file_is_an_error_naming_it(name, tmp_path, marker):
    manager, components, directory = saved_checkpoint(tmp_path / "checkpoints")
    (directory / name).write_bytes(code_running_torch_file(marker))
    with pytest.raises(CheckpointError, match=rf"{directory / name}: .*(refusing|not valid JSON)"):
        manager.load(str(directory), components)


def test_latest_pointer_out_of_the_checkpoint_root_is_refused(tmp_path):
    manager, _, _ = saved_checkpoint(tmp_path / "run" / "checkpoints")
    saved_checkpoint(tmp_path / "other-run" / "checkpoints")
    (tmp_path / "run" / "checkpoints" / "latest").write_text("../../other-run/checkpoints/step-00000003")
    with pytest.raises(CheckpointError, match=r"latest holds '\.\./\.\./other-run.*expected the name of an entry"):
        manager.latest()


def test_resume_from_a_crafted_rng_state_exits_with_one_line(tmp_path, tiny_model, task_files, marker):
    """End to end, as a PyTorchJob runs it: stop, plant the file, resume: exit 2, one line, nothing ran."""
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(stage_dict("sft", tmp_path / "out", tiny_model, task_files["sft_train"],
                                                train={"max_steps": 4, "micro_batch_size": 8})))
    env = {key: value for key, value in os.environ.items() if key not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}

    def trainer(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "trainer", "sft", "--config", str(config), *args],
                              cwd=REPO_ROOT, env={**env, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                              timeout=180)

    assert trainer("--stop-after-steps", "2").returncode == 0
    directory = tmp_path / "out" / "checkpoints" / "step-00000002"
    # The file: `rng-rank0.pt`, planted (or, with pickled RNG state, overwritten) in the checkpoint.
    (directory / "rng-rank0.pt").write_bytes(code_running_torch_file(marker))

    resumed = trainer()
    assert resumed.returncode == 2, resumed.stderr[-3000:]
    errors = [line for line in resumed.stderr.splitlines() if line.startswith("CheckpointError")]
    assert len(errors) == 1 and str(directory / "rng-rank0.pt") in errors[0], resumed.stderr[-3000:]
    assert "Traceback" not in resumed.stderr
    assert not (tmp_path / "out" / "model").exists()


def small_experience() -> Experience:
    ids = torch.arange(6).reshape(2, 3)  # (B, T)
    return Experience(input_ids=ids, attention_mask=torch.ones_like(ids), action_mask=torch.ones_like(ids),
                      position_ids=torch.arange(3).repeat(2, 1), scores=torch.zeros(2))


def test_crafted_experience_batch_is_an_error_naming_it(tmp_path, marker):
    FileBuffer(tmp_path / "buffer").put(small_experience())  # the explorer's batch ...
    (batch,) = (tmp_path / "buffer").glob("batch-*")
    batch.write_bytes(code_running_torch_file(marker))  # ... replaced by someone who can write the prefix
    with pytest.raises(DataError, match=rf"{batch}: not a safetensors file"):
        FileBuffer(tmp_path / "buffer", poll_interval=0.01).get(timeout=1)


def test_crafted_weight_version_is_an_error_naming_it(tmp_path, marker):
    publish_weights(tmp_path / "weights", {"w": torch.zeros(2)}, 0)
    (version,) = (tmp_path / "weights").glob("version-*")
    version.write_bytes(code_running_torch_file(marker))
    with pytest.raises(CheckpointError, match=rf"{version}: not a safetensors file"):
        load_version(tmp_path / "weights")


def test_weights_pointer_to_a_file_outside_the_directory_is_refused(tmp_path):
    publish_weights(tmp_path / "weights", {"w": torch.zeros(2)}, 0)
    (tmp_path / "weights" / "LATEST").write_text("../elsewhere.pt")
    with pytest.raises(CheckpointError, match=r"LATEST holds '\.\./elsewhere\.pt', expected the name of an entry"):
        load_version(tmp_path / "weights")
