"""`python -m trainer.launch`: torchrun whose exit status says "preempted" (143) instead of torchrun's 1.

Real torchrun, 2 processes on gloo. SIGTERM to the launcher (what the kubelet sends the container's
first process) and SIGTERM to one worker both end with a checkpoint at the step reached and exit
143, which the Training Operator's `ExitCode` restart policy retries; any other failure stays
torchrun's own exit 1.
"""

from __future__ import annotations

import json
import os
import signal
import sys

import psutil

from tests.conftest import stage_dict
from tests.integration.services import free_port
from tests.integration.trainer_process import TrainerProcess, latest_step, write_config


def launcher() -> list[str]:
    return [sys.executable, "-m", "trainer.launch", "--nproc_per_node=2", "--master_addr=127.0.0.1",
            f"--master_port={free_port()}", "-m", "trainer"]


def sft_config(output, tiny_model, task_files) -> dict:
    # 80 samples in micro-batches of 4 on 2 ranks: 10 steps an epoch; no interval checkpoint before the signal.
    return stage_dict("sft", output, tiny_model, task_files["sft_train"], parallel={"plugin": "ddp"},
                      train={"max_epochs": 20, "micro_batch_size": 4, "log_interval": 1},
                      checkpoint={"save_interval": 1000, "keep_last": 0})


def workers(child: TrainerProcess) -> dict[int, psutil.Process]:
    return {int(p.environ().get("RANK", -1)): p for p in psutil.Process(child.process.pid).children(recursive=True)
            if "trainer" in " ".join(p.cmdline())}


def assert_stopped_with_a_checkpoint(child: TrainerProcess, output) -> None:
    stopped_at = latest_step(output / "checkpoints")
    state = json.loads((output / "checkpoints" / f"step-{stopped_at:08d}" / "trainer_state.json").read_text())
    assert state["global_step"] == stopped_at >= 3
    assert f"stopped after step {stopped_at} (signal 15)" in child.stderr
    assert not (output / "model").exists()


def test_sigterm_to_the_launcher_exits_143_with_a_checkpoint_at_the_step_reached(tmp_path, tiny_model, task_files):
    output = tmp_path / "out"
    child = TrainerProcess("sft", write_config(tmp_path / "sft.yaml", sft_config(output, tiny_model, task_files)),
                           command=launcher())
    child.wait_for(r"step 3/")
    child.send(signal.SIGTERM)  # the launcher only: torchrun's agent forwards it to both workers
    code = child.wait(120)

    assert code == 143, child.stderr[-3000:]
    assert_stopped_with_a_checkpoint(child, output)
    assert child.stderr.splitlines()[-1].startswith("torchrun: stopped by SIGTERM")
    assert "Traceback" not in child.stderr


def test_sigterm_to_one_worker_exits_143_not_torchruns_1(tmp_path, tiny_model, task_files):
    output = tmp_path / "out"
    child = TrainerProcess("sft", write_config(tmp_path / "sft.yaml", sft_config(output, tiny_model, task_files)),
                           command=launcher())
    child.wait_for(r"step 3/")
    os.kill(workers(child)[1].pid, signal.SIGTERM)  # both ranks stop at the same step and exit 143
    code = child.wait(120)

    assert code == 143, child.stderr[-3000:]
    assert_stopped_with_a_checkpoint(child, output)
    assert child.stderr.splitlines()[-1].startswith("torchrun: the workers were stopped by a signal")


def test_a_failing_worker_is_still_torchruns_exit_1(tmp_path, tiny_model, task_files):
    config = sft_config(tmp_path / "out", tiny_model, task_files) | {"no_such_key": 1}  # both workers exit 2
    child = TrainerProcess("sft", write_config(tmp_path / "sft.yaml", config), command=launcher())
    code = child.wait(120)

    assert code == 1, child.stderr[-3000:]
    assert "no_such_key" in child.stderr
    assert "ChildFailedError" in child.stderr  # torchrun's own report of the failed workers


def test_workers_stopped_by_the_agent_after_a_preempted_one_still_mean_preempted():
    from trainer.launch import preempted_status

    # Rank 1 saved and exited 143; the agent then sent SIGTERM to rank 0, which was already exiting.
    assert preempted_status([-15, 143]) == 143
    assert preempted_status([130]) == 130
    assert preempted_status([-15]) is None  # killed by a signal without any worker's stopping checkpoint
    assert preempted_status([143, 1]) is None  # one worker really failed
    assert preempted_status([2, -15]) is None


def test_a_trainjobs_secret_files_become_the_trainers_environment(tmp_path):
    from trainer.launch import export_secret_files

    # What the kubelet mounts for a Secret volume with items: each key as a file, plus its `..data` link.
    s3, absent = tmp_path / "s3", tmp_path / "mlflow-optional"
    s3.mkdir()
    (s3 / "AWS_ACCESS_KEY_ID").write_text("key")
    (s3 / "AWS_SECRET_ACCESS_KEY").write_text("sec ret\n")  # exactly the bytes the Secret holds
    (s3 / "..2026_12_01").mkdir()
    (s3 / "..data").symlink_to(s3 / "..2026_12_01")
    environ = {"ALIGNFLOW_SECRET_ENV_DIRS": f"{s3}:{absent}", "AWS_ACCESS_KEY_ID": "stale"}
    assert export_secret_files(environ) == ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"]
    assert (environ["AWS_ACCESS_KEY_ID"], environ["AWS_SECRET_ACCESS_KEY"]) == ("key", "sec ret\n")
    assert export_secret_files({}) == []
