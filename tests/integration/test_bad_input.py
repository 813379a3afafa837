"""Bad input and bad state, as `python -m trainer` reports them: one line naming the place, a non-zero
exit status (0 for a finished run), no traceback, and no model exported.

Most cases call the entry point in this process (`trainer.__main__.main`, what the subprocess runs)
to keep the table fast; divergence runs as a real subprocess too.
"""

from __future__ import annotations

import shutil
import socket
import time
from pathlib import Path

import pytest
import torch

from tests.conftest import stage_dict
from tests.integration.trainer_process import error_lines, run_trainer, write_config
from trainer.__main__ import main
from trainer.lifecycle.lease import LEASE_FILE, Lease
from trainer.storage.s3 import S3Storage
from trainer.tiny.model import write_tiny_model


def cli(capsys, stage: str, config: dict, tmp_path: Path, *args: str) -> tuple[int, str]:
    """Run the entry point; (exit status, its one error line) - asserting there is exactly one."""
    path = write_config(tmp_path / f"{stage}.yaml", config)
    capsys.readouterr()
    code = main([stage, "--config", str(path), *args])
    stderr = capsys.readouterr().err
    assert "Traceback" not in stderr
    lines = error_lines(stderr)
    assert len(lines) == 1, stderr[-3000:]
    return code, lines[0]


def sft(output, model, task_files, **updates) -> dict:
    return stage_dict("sft", output, model, task_files["sft_train"],
                      **{"train": {"max_steps": 6, "micro_batch_size": 8}, **updates})


def test_divergence_as_a_subprocess_fails_with_one_line_and_exports_nothing(tmp_path, tiny_model, task_files):
    config = write_config(tmp_path / "sft.yaml", sft(tmp_path / "out", tiny_model, task_files,
                                                      optimizer={"lr": 1e10}))
    code, stderr = run_trainer("sft", config)
    assert code == 2 and "Traceback" not in stderr
    (line,) = error_lines(stderr)
    assert line.startswith("TrainingError: ") and "non-finite" in line
    assert not (tmp_path / "out" / "model").exists()
    assert "NaN" not in (tmp_path / "out" / "metrics.jsonl").read_text()  # valid JSON: null, not NaN


def broken_model(kind: str, tiny_model: Path, directory: Path) -> Path:
    shutil.copytree(tiny_model, directory)
    if kind == "no tokenizer":
        for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
            (directory / name).unlink(missing_ok=True)
    elif kind == "no weights":
        (directory / "model.safetensors").unlink()
    else:  # truncated weights
        weights = directory / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[:1000])
    return directory


@pytest.mark.parametrize(("kind", "expected"), [
    ("no tokenizer", r"ConfigError: model.path: .*/broken has no tokenizer"),
    ("no weights", r"ConfigError: model.path: .*/broken has no weights \(expected one of model.safetensors"),
    ("truncated weights", r"ConfigError: model.path: cannot load the weights in .*/broken \(model.safetensors\)"),
])
def test_broken_model_directory(kind, expected, capsys, tmp_path, tiny_model, task_files):
    model = broken_model(kind, tiny_model, tmp_path / "broken")
    code, line = cli(capsys, "sft", sft(tmp_path / "out", model, task_files), tmp_path)
    assert code == 2
    assert pytest.importorskip("re").match(expected, line), line
    assert not (tmp_path / "out").exists()  # failed before writing anything


@pytest.mark.parametrize("stage", [pytest.param("sft", marks=pytest.mark.slow), "dpo"])  # sft: subprocess above
def test_divergence_fails_with_one_line_and_exports_nothing(stage, capsys, tmp_path, tiny_model, task_files):
    data = task_files["sft_train"] if stage == "sft" else task_files["pref_eval"]
    config = stage_dict(stage, tmp_path / "out", tiny_model, data, optimizer={"lr": 1e10},
                        train={"max_steps": 8, "micro_batch_size": 8, "max_nonfinite_steps": 3})
    code, line = cli(capsys, stage, config, tmp_path)
    assert code == 2 and line.startswith("TrainingError: step ") and "train.max_nonfinite_steps is 3" in line
    assert not (tmp_path / "out" / "model").exists()


def test_boolean_for_a_number_is_refused(capsys, tmp_path, tiny_model, task_files):
    path = write_config(tmp_path / "sft.yaml", sft(tmp_path / "out", tiny_model, task_files))
    capsys.readouterr()
    assert main(["sft", "--config", str(path), "--set", "train.micro_batch_size=true"]) == 2
    # ConfigError's format: a heading, then one line per problem.
    assert capsys.readouterr().err.splitlines() == [
        "ConfigError: invalid config:",
        "  --set train.micro_batch_size: train.micro_batch_size is True, expected: a number, not a boolean"]


def test_rerun_of_a_finished_run_says_so_and_exits_0(capsys, tmp_path, tiny_model, task_files):
    config = sft(tmp_path / "out", tiny_model, task_files)
    assert main(["sft", "--config", str(write_config(tmp_path / "first.yaml", config))]) == 0
    code, line = cli(capsys, "sft", config, tmp_path)
    assert code == 0 and line.startswith(f"RunFinished: {tmp_path / 'out'} already holds a finished sft run")


def test_output_dir_held_by_a_live_run(capsys, tmp_path, tiny_model, task_files):
    holder = Lease(str(tmp_path / "out"), timeout_seconds=60)
    holder.holder.update(host="trainer-pod-0", pid=4242)
    holder.acquire()
    try:
        code, line = cli(capsys, "sft", sft(tmp_path / "out", tiny_model, task_files), tmp_path)
    finally:
        holder.release()
    assert code == 2 and line.startswith(f"LeaseError: {tmp_path / 'out' / LEASE_FILE}: output_dir is in use")
    assert "host trainer-pod-0, pid 4242, started " in line


def test_a_stale_lease_is_taken_over(capsys, tmp_path, tiny_model, task_files):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / LEASE_FILE).write_text(
        f'{{"host": "gone-pod", "pid": 1, "started": "x", "token": "t", "heartbeat": {time.time() - 3600}}}')
    assert main(["sft", "--config", str(write_config(tmp_path / "sft.yaml",
                                                     sft(tmp_path / "out", tiny_model, task_files)))]) == 0
    assert not (tmp_path / "out" / LEASE_FILE).exists()  # released at the end


def test_reward_model_without_head(capsys, tmp_path, tiny_model, task_files):
    config = stage_dict("ppo", tmp_path / "out", tiny_model, task_files["prompts"],
                        reward={"model_path": str(tiny_model)}, ppo={"num_episodes": 1})
    code, line = cli(capsys, "ppo", config, tmp_path)
    assert code == 2 and line.startswith("ConfigError: reward.model_path: ") and "no trained value head" in line


def test_missing_bucket(capsys, s3_endpoint, tmp_path, tiny_model, task_files):
    code, line = cli(capsys, "sft", sft("s3://no-such-bucket/runs/sft", tiny_model, task_files), tmp_path)
    assert code == 2
    assert line == (f"StorageError: s3://no-such-bucket/runs/sft/checkpoints: cannot list: bucket 'no-such-bucket' "
                    f"does not exist at {s3_endpoint}")


@pytest.fixture
def unreachable(s3_endpoint, monkeypatch):
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        endpoint = f"http://127.0.0.1:{sock.getsockname()[1]}"
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    monkeypatch.setenv("ALIGNFLOW_S3_RETRY_SECONDS", "2")
    S3Storage._shared = None
    yield endpoint
    S3Storage._shared = None


def test_unreachable_endpoint(capsys, unreachable, tmp_path, tiny_model, task_files):
    started = time.monotonic()
    code, line = cli(capsys, "sft", sft("s3://bucket/runs/sft", tiny_model, task_files), tmp_path)
    assert code == 2 and time.monotonic() - started < 60
    assert line.startswith(f"StorageError: s3://bucket/runs/sft/checkpoints: cannot list at S3 endpoint {unreachable}: ")
    assert "ALIGNFLOW_S3_RETRY_SECONDS is 2" in line


def test_only_checkpoint_with_a_truncated_state_file(capsys, tmp_path, tiny_model, task_files):
    config = sft(tmp_path / "out", tiny_model, task_files)
    path = str(write_config(tmp_path / "first.yaml", config))
    assert main(["sft", "--config", path, "--stop-after-steps", "2"]) == 0
    state = tmp_path / "out" / "checkpoints" / "step-00000002" / "trainer_state.json"
    state.write_text('{"epoch": 0, "glo')
    code, line = cli(capsys, "sft", config, tmp_path)
    assert code == 2 and line.startswith("CheckpointError: ") and f"{state}: not valid JSON" in line


def test_model_of_another_shape_than_the_checkpoint(capsys, tmp_path, task_files):
    model = write_tiny_model(tmp_path / "model")
    config = sft(tmp_path / "out", model, task_files)
    assert main(["sft", "--config", str(write_config(tmp_path / "first.yaml", config)), "--stop-after-steps", "2"]) == 0
    shutil.rmtree(model)
    write_tiny_model(model, hidden_size=32)
    code, line = cli(capsys, "sft", config, tmp_path)
    assert code == 2 and "does not fit the model being trained: size mismatch for model.embed_tokens.weight" in line




def test_grpo_policy_with_non_finite_logits_fails_with_one_line_not_a_sampling_traceback(capsys, tmp_path,
                                                                                         tiny_model, task_files):
    from safetensors.torch import load_file, save_file

    model = shutil.copytree(tiny_model, tmp_path / "diverged")
    weights = load_file(model / "model.safetensors")
    weights["lm_head.weight"] = torch.full_like(weights["lm_head.weight"], float("nan"))  # NaN logits
    save_file(weights, model / "model.safetensors", metadata={"format": "pt"})
    config = stage_dict("grpo", tmp_path / "out", model, task_files["prompts"], train={"micro_batch_size": 4},
                        generation={"max_new_tokens": 3}, reward={"function": "trainer.tiny.task:reward"},
                        grpo={"num_episodes": 2, "rollout_batch_size": 4, "mini_batch_size": 4, "num_generations": 2})
    code, line = cli(capsys, "grpo", config, tmp_path)
    assert code == 2
    assert line.startswith("TrainingError: the policy's next-token probabilities are not finite"), line
    assert not (tmp_path / "out" / "model").exists()
