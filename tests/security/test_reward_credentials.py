"""Reward-service and judge tokens never show up in logs, run files, MLflow params, tags or metrics (issue 31).

A GRPO run scores with a reward service (token from an environment variable, as a Secret mapped to
env) and an LLM judge (token from a file, as a mounted Secret), both real HTTP services on loopback
that first answer 503 (so retry warnings are logged) and check the bearer token. The run tracks to
a real MLflow server; then every log record, stdout/stderr, every file the run wrote and the MLflow
run's params, tags and metrics are scanned for either token.
"""

from __future__ import annotations

import logging
import secrets

from tests.conftest import make_config
from tests.security.test_secrets import leaks
from tests.trainer.rewards.servers import ScriptedService
from trainer.online.stages import run_online_stage


def authorised(token: str, answer):
    """A service answer that insists on `Bearer <token>` and is busy (503) on its first call."""
    def respond(body, call, headers):
        if call == 1:
            return 503, {"error": "warming up"}
        if headers.get("Authorization") != f"Bearer {token}":
            return 401, {"error": "bad token"}
        return 200, answer(body)
    return respond


def test_reward_tokens_appear_in_no_log_file_param_tag_or_metric(mlflow_server, tmp_path, tiny_model, task_files,
                                                                 monkeypatch, caplog, capfd):
    uri, artifacts = mlflow_server
    planted = {"service": "rm-" + secrets.token_urlsafe(24), "judge": "judge-" + secrets.token_urlsafe(24)}
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("ALIGNFLOW_TEST_RM_TOKEN", planted["service"])
    token_file = tmp_path / "secret" / "token"
    token_file.parent.mkdir()
    token_file.write_text(planted["judge"] + "\n")
    reward = ScriptedService(None)
    reward.respond = authorised(planted["service"], lambda body: {"scores": [0.5] * len(body["prompts"])})
    judge = ScriptedService(None)
    judge.respond = authorised(planted["judge"], lambda body: {"choices": [{"message": {"content": "Score: 7"}}]})
    sources = [{"kind": "function", "name": "tiny_addition"},
               {"kind": "remote", "name": "rm", "weight": 0.5,
                "service": {"url": reward.url + "/score", "token_env": "ALIGNFLOW_TEST_RM_TOKEN", "backoff_seconds": 0}},
               {"kind": "judge", "name": "judge", "weight": 0.5,
                "service": {"url": judge.url + "/v1", "token_file": str(token_file), "backoff_seconds": 0},
                "judge": {"model": "any"}}]
    config = make_config("grpo", tmp_path / "out", tiny_model, task_files["prompts"], reward={"sources": sources},
                         generation={"max_new_tokens": 3},
                         grpo={"num_episodes": 1, "rollout_batch_size": 2, "num_generations": 2, "mini_batch_size": 4},
                         tracking={"backend": "mlflow", "experiment_name": "reward-security",
                                   "pipeline_run_id": "p-31"})
    try:
        with caplog.at_level(logging.DEBUG):
            run_online_stage(config)
    finally:
        reward.stop()
        judge.stop()
    assert reward.headers[-1]["Authorization"] == f"Bearer {planted['service']}"  # the tokens were really used
    assert judge.headers[-1]["Authorization"] == f"Bearer {planted['judge']}"
    assert any("answered HTTP 503 Service Unavailable: warming up; retrying" in r.getMessage() for r in caplog.records)

    found: dict[str, list[str]] = {}
    for record in caplog.records:
        if hits := leaks(record.getMessage() + (record.exc_text or ""), planted):
            found[f"log {record.name}:{record.lineno}"] = hits
    captured = capfd.readouterr()
    if hits := leaks(captured.out + captured.err, planted):
        found["stdout/stderr"] = hits
    files = [p for root in (tmp_path / "out", artifacts) for p in root.rglob("*") if p.is_file()]
    assert any(p.name == "metrics.jsonl" for p in files)
    for path in files:
        if hits := leaks(path.read_bytes().decode("latin-1"), planted):
            found[str(path)] = hits
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("reward-security")
    (run,) = client.search_runs([experiment.experiment_id], "tags.`alignflow.pipeline_run_id` = 'p-31'")
    assert "rewards/rm/mean" in run.data.metrics and "rewards/judge/mean" in run.data.metrics
    for kind, entries in (("param", run.data.params), ("tag", run.data.tags), ("metric", run.data.metrics)):
        for key, value in entries.items():
            if hits := leaks(f"{key}={value}", planted):
                found[f"MLflow {kind} {key}"] = hits
    assert not found, found
