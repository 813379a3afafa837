"""The chart's reference reward server (`rewardServer`): off by default; on, a Deployment and a Service that lint,
validate strictly, meet the restricted profile, and take the token from a Secret only."""

from __future__ import annotations

import pytest

from tests.helm.chart import CHART, EVERYTHING, KUBERNETES_VERSION, render
from tests.helm.test_pod_security import restricted_violations

ON = {"rewardServer": {"enabled": True, "modelUri": "s3://alignflow/runs/r1/rm/model", "tokenSecret": "reward-token"},
      "s3": {"credentialsSecret": "s3-credentials", "endpoint": "http://minio:9000"}}


def reward_documents(values: dict) -> list[dict]:
    return [d for d in render(values) if d["metadata"]["name"].endswith("-rewards")]


def test_reward_server_is_off_by_default():
    assert reward_documents({}) == []


@pytest.mark.parametrize("values", [ON, {**EVERYTHING, **ON}], ids=["reward-server", "everything"])
def test_reward_server_lints_validates_and_is_restricted(values):
    import helm_python
    import kubernetes_validate

    report = helm_python.lint(str(CHART), values, strict=True)
    assert report["errors"] == [] and [m for m in report["messages"] if m["severity"] >= 2] == []
    documents = reward_documents(values)
    assert sorted(d["kind"] for d in documents) == ["Deployment", "Service"]
    for document in documents:
        kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)
    [deployment] = [d for d in documents if d["kind"] == "Deployment"]
    spec = deployment["spec"]["template"]["spec"]
    assert restricted_violations(spec) == []
    [container] = spec["containers"]
    assert container["command"] == ["python", "-m", "trainer.rewards.server"]
    assert "--model=s3://alignflow/runs/r1/rm/model" in container["args"]
    assert "--token-env=ALIGNFLOW_REWARD_SERVER_TOKEN" in container["args"]
    [token] = [e for e in container["env"] if e["name"] == "ALIGNFLOW_REWARD_SERVER_TOKEN"]
    assert token["valueFrom"] == {"secretKeyRef": {"name": "reward-token", "key": "token"}}
    assert container["readinessProbe"]["httpGet"]["path"] == "/health"


def test_no_token_secret_means_no_token_flag_and_no_secret_written():
    values = {"rewardServer": {"enabled": True, "modelUri": "/models/rm"}}
    documents = render(values)
    assert not any(d["kind"] == "Secret" for d in documents)
    [deployment] = [d for d in reward_documents(values) if d["kind"] == "Deployment"]
    assert not any(a.startswith("--token-env") for a in deployment["spec"]["template"]["spec"]["containers"][0]["args"])


def test_enabled_without_a_model_fails_with_a_sentence():
    import helm_python

    with pytest.raises(helm_python.HelmRenderError, match="rewardServer.modelUri is empty"):
        render({"rewardServer": {"enabled": True}})


def test_a_token_value_is_not_a_key_the_schema_admits():
    import helm_python

    with pytest.raises(helm_python.HelmValuesError, match="additional properties 'token' not allowed"):
        render({"rewardServer": {"enabled": True, "modelUri": "/m", "token": "plain-text"}})
