"""rlhf-grpo on the `tiny-vllm` preset through kfp.local: GRPO and the evaluation sample with vLLM
(`rollout_engine: vllm`), and the candidate beats its SFT baseline, so the registration gate opens. Then
the same run left on `rollout_engine: auto`: in the environment of the trainer image's vLLM variant (this
one) each job chooses `hf`, as the tiny model is far below vllm's CPU crossover. No job's log ends with
nanobind's list of objects alive at exit (triton's bindings; trainer/lifecycle/collector.py).

Runs only in the vLLM environment (`make test-vllm`); elsewhere the module is skipped.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("vllm", reason="vLLM runs in its own environment: make test-vllm")

from pipelines.local_run import run_locally, task_outputs  # noqa: E402


def test_grpo_pipeline_sampled_by_vllm_opens_the_registration_gate(tmp_path):
    run_dir = run_locally("rlhf-grpo", tmp_path, {}, preset="tiny-vllm")
    summary = task_outputs(run_dir, started=0.0)

    evaluation = summary["evaluate-model"]["metrics"]
    assert 0 < evaluation["baseline_reward"] < 1
    assert evaluation["improvement"] > 0 and "register-model" in summary
    config = (run_dir / "train-grpo" / "report").read_text()
    assert "engine: vllm" in config  # the stage's resolved config: sampled by vLLM
    jobs = sorted(tmp_path.rglob("evaluate.yaml"))  # the evaluation job's config, as the launcher wrote it
    assert jobs and all("engine: vllm" in path.read_text() for path in jobs), jobs
    logs = sorted(tmp_path.rglob("logs/*/*.log"))
    assert logs and not [log for log in logs if "nanobind" in log.read_text()]


def test_grpo_pipeline_left_on_auto_chooses_in_the_vllm_environment(tmp_path):
    run_dir = run_locally("rlhf-grpo", tmp_path, {"rollout_engine": "auto"}, preset="tiny-vllm",
                          log_dir=tmp_path / "logs")
    summary = task_outputs(run_dir, started=0.0)
    assert "evaluate-model" in summary
    assert not [log for log in (tmp_path / "logs").glob("*.log") if "nanobind" in log.read_text()]
    # The job resolved auto itself, with vLLM importable, and recorded what it chose.
    params = json.loads((run_dir / "train-grpo" / "job" / "params.json").read_text())
    assert params["rollout"]["engine"] == "auto" and params["rollout.chosen_engine"] == "hf"
    evaluation_log = (tmp_path / "logs" / "evaluate-model.log").read_text()
    assert evaluation_log.count(": hf, as on the CPU") == 2, evaluation_log  # per model: candidate and baseline
