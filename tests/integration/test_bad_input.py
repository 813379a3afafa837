"""Bad input and bad state, as `python -m trainer` reports them: one line naming the place, a non-zero
exit status (0 for a finished run), no traceback, and no model exported.

Most cases call the entry point in this process (`trainer.__main__.main`, what the subprocess runs)
to keep the table fast; divergence runs as a real subprocess too.
"""

from __future__ import annotations

import json
import shutil
import socket
import time
from pathlib import Path

import pytest
import torch

from tests.conftest import stage_dict
from tests.integration.trainer_process import error_lines, run_trainer, write_config
from tests.trainer.asynchronous.test_engine import engine_config, train_on_batches
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
    elif kind == "corrupt config":
        (directory / "config.json").write_text((directory / "config.json").read_text()[:200])
    elif kind == "unknown model type":
        (directory / "config.json").write_text((directory / "config.json").read_text().replace('"llama"', '"nosuch"'))
    else:  # truncated weights
        weights = directory / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[:1000])
    return directory


@pytest.mark.parametrize(("kind", "expected"), [
    ("no tokenizer", r"ConfigError: model.path: .*/broken has no tokenizer"),
    ("no weights", r"ConfigError: model.path: .*/broken has no weights \(expected one of model.safetensors"),
    ("truncated weights", r"ConfigError: model.path: cannot load the weights in .*/broken \(model.safetensors\)"),
    # Not "cannot load the tokenizer": the tokenizer is read first, but config.json is at fault.
    ("corrupt config", r"ConfigError: model.path: .*/broken/config.json: not valid JSON: Unterminated string .* line 11"),
    ("unknown model type", r"ConfigError: model.path: .*/broken/config.json: not a usable model config: .* type `nosuch`"),
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


# ---- issue 24: bad data, a file for a directory, unknown schemes, huge lines, silent damage -------------------


def damaged_sft_file(task_files, directory: Path) -> Path:
    """The tiny task's SFT rows with line 5's completion emptied and a byte that is not UTF-8 on line 8."""
    lines = task_files["sft_train"].read_bytes().splitlines(keepends=True)
    lines[4] = b'{"prompt": "0+5=", "completion": ""}\n'
    lines[7] = lines[7].replace(b'"completion": "', b'"completion": "\xff')
    path = directory / "damaged.jsonl"
    path.write_bytes(b"".join(lines))
    return path


@pytest.mark.parametrize(("line", "expected"), [
    (5, "completion is empty: nothing to train on"),
    (8, "not UTF-8 text: byte 0xff at byte 35 of the line; save the file as UTF-8"),
])
def test_a_bad_row_names_its_file_and_line(line, expected, capsys, tmp_path, tiny_model, task_files):
    data = damaged_sft_file(task_files, tmp_path)
    if line == 8:  # the empty completion fixed, so that the row after it is the first bad one
        data.write_bytes(data.read_bytes().replace(b'"completion": ""', b'"completion": "5"'))
    config = sft(tmp_path / "out", tiny_model, task_files, data={"train_path": str(data), "max_length": 32})
    code, error = cli(capsys, "sft", config, tmp_path)
    assert code == 2 and error == f"DataError: {data}:{line}: {expected}"
    assert not (tmp_path / "out").exists()


def test_skip_bad_rows_skips_undecodable_and_empty_rows_and_the_metrics_count_them(capsys, tmp_path, tiny_model,
                                                                                    task_files):
    data = damaged_sft_file(task_files, tmp_path)
    config = sft(tmp_path / "out", tiny_model, task_files,
                 data={"train_path": str(data), "max_length": 32, "skip_bad_rows": True})
    assert main(["sft", "--config", str(write_config(tmp_path / "sft.yaml", config))]) == 0
    assert f"skipping bad row: {data}:5: completion is empty" in capsys.readouterr().err
    assert json.loads((tmp_path / "out" / "final_metrics.json").read_text())["data/train_skipped"] == 2


@pytest.mark.parametrize("place", ["output_dir", "export_dir"])
def test_a_file_where_a_directory_goes(place, capsys, tmp_path, tiny_model, task_files):
    (tmp_path / "taken").write_text("not a directory")
    config = sft(tmp_path / "out", tiny_model, task_files)
    config[place] = str(tmp_path / "taken") if place == "output_dir" else str(tmp_path / "taken" / "model")
    code, line = cli(capsys, "sft", config, tmp_path)
    expected = "is a file, expected a directory" if place == "output_dir" else "is a file, so "
    assert code == 2 and line.startswith(f"ConfigError: {place}: {tmp_path / 'taken'} {expected}")
    assert (tmp_path / "taken").read_text() == "not a directory" and not (tmp_path / "out").exists()


def test_a_data_path_with_an_unsupported_scheme(capsys, tmp_path, tiny_model, task_files):
    path = write_config(tmp_path / "sft.yaml", sft(tmp_path / "out", tiny_model, task_files,
                                                   data={"train_path": "gs://b/x.jsonl"}))
    capsys.readouterr()
    assert main(["sft", "--config", str(path)]) == 2
    heading, problem = capsys.readouterr().err.strip().splitlines()[-2:]
    assert heading == "ConfigError: invalid config:"
    assert problem.startswith(f"  {path}:") and "data.train_path is 'gs://b/x.jsonl', expected: a local path" in problem
    assert problem.endswith("gs:// is not supported")  # not "no such file or directory": never read as a path


def test_a_10_mb_line_is_read_in_seconds(capsys, tmp_path, tiny_model, task_files):
    from trainer.data.dataset import load_sft_dataset
    from trainer.modeling.models import load_tokenizer

    data = tmp_path / "huge.jsonl"
    huge = json.dumps({"prompt": "1+2=", "completion": "3" + "1234567890+" * 950_000})  # 10.5 MB
    data.write_text(task_files["sft_train"].read_text() + huge + "\n")
    started = time.monotonic()
    examples = load_sft_dataset(str(data), load_tokenizer(str(tiny_model)), 32, False).examples
    # Tokenizing the whole line took 22 s on a 2-core machine (and over 240 s under load); the row keeps
    # only max_length tokens, and only about those are tokenized now (0.07 s).
    assert time.monotonic() - started < 10
    assert len(examples) == 81 and len(examples[-1]["input_ids"]) == 32
    config = sft(tmp_path / "out", tiny_model, task_files, data={"train_path": str(data), "max_length": 32})
    assert main(["sft", "--config", str(write_config(tmp_path / "sft.yaml", config))]) == 0
    assert (tmp_path / "out" / "model" / "model.safetensors").is_file()


@pytest.mark.parametrize(("lr", "warning"), [(1e6, "loss did not fall over the run"), (2e-3, None)])
def test_a_loss_that_does_not_fall_is_a_warning_in_the_log_the_final_metrics_and_the_report(
        lr, warning, capsys, tmp_path, tiny_model, task_files):
    from components.reports.stage import stage_report

    # 8 steps, each logged. lr 1e6: one step to finite but ruined weights (a uniform next-token distribution),
    # then flat: 4.668, 4.615, 4.615, ... Exported all the same (exit 0): the user decides.
    config = sft(tmp_path / "out", tiny_model, task_files, optimizer={"lr": lr, "warmup_steps": 0},
                 train={"max_steps": 8, "micro_batch_size": 8, "log_interval": 1},
                 data={"train_path": str(task_files["sft_train"]), "eval_path": str(task_files["sft_eval"]),
                       "max_length": 32})
    capsys.readouterr()
    assert main(["sft", "--config", str(write_config(tmp_path / "sft.yaml", config))]) == 0
    logged = [line for line in capsys.readouterr().err.splitlines() if " WARNING " in line and "loss " in line]
    final = json.loads((tmp_path / "out" / "final_metrics.json").read_text())
    report = stage_report("sft", config, final, str(tmp_path / "out"))
    if warning is None:
        assert logged == [] and "warnings" not in final and "## Warnings" not in report
    else:
        assert len(logged) == 1 and warning in logged[0]
        assert len(final["warnings"]) == 1 and final["warnings"][0].startswith(warning)
        assert f"## Warnings\n\n- **Warning:** {warning}" in report
    assert (tmp_path / "out" / "model" / "model.safetensors").is_file()
    # One metrics line per step: the epoch's eval at step 8 joins that step's line.
    steps = [json.loads(line)["step"] for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, 9))


def test_the_asynchronous_trainer_writes_one_metrics_line_per_step(tmp_path, tiny_model, task_files):
    # A checkpoint every step: its save time used to be a second line for the step.
    train_on_batches(engine_config(tmp_path, tiny_model, task_files, total_steps=2, save_interval=1), 2)
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2]
    assert all("loss" in line and "time/save_checkpoint" in line for line in lines)


@pytest.mark.parametrize(("row", "expected"), [
    ('{"prompt": ""}', "prompt is empty"),
    # 40 characters, 40 tokens of the tiny tokenizer: generating after it could run past the model's positions
    ('{"prompt": "' + "1+" * 20 + '"}', "prompt is 40 tokens, longer than data.max_length (32); raise data.max_length, "
                                        "shorten the prompt, or set data.skip_bad_rows"),
])
def test_a_bad_eval_row_of_an_online_stage_fails_before_anything_is_written(row, expected, capsys, tmp_path,
                                                                            tiny_model, task_files):
    prompts = tmp_path / "eval.jsonl"
    prompts.write_text('{"prompt": "1+1=", "answer": "2"}\n' + row + "\n")
    config = stage_dict("grpo", tmp_path / "out", tiny_model, task_files["prompts"], prompts,
                        reward={"function": "trainer.tiny.task:reward"}, data={"max_length": 32})
    code, line = cli(capsys, "grpo", config, tmp_path)
    assert code == 2 and line == f"DataError: {prompts}:2: {expected}"
    assert not (tmp_path / "out").exists()  # no lease, no config.yaml: the outputs were never opened
