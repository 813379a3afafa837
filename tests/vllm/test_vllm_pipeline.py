"""rlhf-grpo on the `tiny-vllm` preset through kfp.local: GRPO and the evaluation sample with vLLM
(`rollout_engine: vllm`), and the candidate beats its SFT baseline, so the registration gate opens.

Runs only in the vLLM environment (`make test-vllm`); elsewhere the module is skipped.
"""

from __future__ import annotations

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
