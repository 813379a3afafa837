"""The optional code sandbox service as rendered: the server's real flags, the token from a Secret, no egress."""

from __future__ import annotations

import pytest

from tests.helm.chart import render
from tests.helm.test_pod_security import restricted_violations
from trainer.sandbox import SandboxLimits
from trainer.sandbox.server import parse_arguments

ENABLED = {"sandbox": {"enabled": True, "tokenSecret": "sandbox-token"}}


def kinds(documents: list[dict]) -> dict[str, dict]:
    return {d["kind"]: d for d in documents if d["metadata"]["name"] == "af-alignflow-sandbox"}


def test_off_by_default():
    assert kinds(render({})) == {}


def test_needs_a_token_secret():
    import helm_python

    with pytest.raises(helm_python.HelmRenderError, match="sandbox.tokenSecret is empty: name an existing Secret"):
        render({"sandbox": {"enabled": True}})


def test_the_container_runs_the_server_with_flags_it_accepts_and_the_ceilings_from_values():
    documents = kinds(render({"sandbox": {**ENABLED["sandbox"], "concurrency": 2,
                                          "maxLimits": {"wallSeconds": 12.5, "maxProcesses": 8}}}))
    spec = documents["Deployment"]["spec"]["template"]["spec"]
    [container] = spec["containers"]
    assert container["command"] == ["python", "-m", "trainer.sandbox.server"]
    assert container["image"] == "ghcr.io/alignflow/trainer:latest"
    arguments = parse_arguments(container["args"])  # the real argparse: an unknown flag would exit
    assert (arguments.port, arguments.concurrency) == (8080, 2)
    ceilings = {name: getattr(arguments, f"ceiling_{name}") for name in SandboxLimits.model_fields}
    assert ceilings == {**SandboxLimits(wall_seconds=30, cpu_seconds=30).model_dump(), "wall_seconds": 12.5,
                        "max_processes": 8}
    # every limit has its ceiling flag in the template, none left at the server's default by omission
    assert len([arg for arg in container["args"] if arg.startswith("--max-")]) == len(SandboxLimits.model_fields)


def test_the_token_comes_from_the_secret_as_a_file_and_no_api_token_is_mounted():
    spec = kinds(render(ENABLED))["Deployment"]["spec"]["template"]["spec"]
    [container] = spec["containers"]
    token_file = parse_arguments(container["args"]).token_file
    [mount] = [m for m in container["volumeMounts"] if m["name"] == "token"]
    [volume] = [v for v in spec["volumes"] if v["name"] == "token"]
    assert token_file == f"{mount['mountPath']}/token" and mount["readOnly"]
    assert volume["secret"] == {"secretName": "sandbox-token", "items": [{"key": "token", "path": "token"}]}
    assert not any("token" in str(item).lower() for item in container.get("env", []))
    assert spec["automountServiceAccountToken"] is False


def test_restricted_read_only_and_a_bounded_scratch_volume():
    spec = kinds(render({"sandbox": {**ENABLED["sandbox"], "scratchSize": "2Gi"}}))["Deployment"]["spec"][
        "template"]["spec"]
    assert restricted_violations(spec) == []
    [container] = spec["containers"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    [scratch] = [v for v in spec["volumes"] if v["name"] == "scratch"]
    assert scratch["emptyDir"] == {"sizeLimit": "2Gi"}
    assert {"name": "TMPDIR", "value": "/scratch"} in container["env"]


def test_no_egress_and_only_the_http_port_in():
    documents = kinds(render(ENABLED))
    policy = documents["NetworkPolicy"]["spec"]
    assert policy["policyTypes"] == ["Ingress", "Egress"] and policy["egress"] == []
    assert policy["ingress"] == [{"ports": [{"port": 8080, "protocol": "TCP"}]}]
    assert policy["podSelector"]["matchLabels"] == documents["Service"]["spec"]["selector"]
    assert documents["Service"]["spec"]["ports"] == [{"name": "http", "port": 8080, "targetPort": "http"}]
    no_policy = kinds(render({"sandbox": {**ENABLED["sandbox"], "networkPolicy": {"enabled": False}}}))
    assert "NetworkPolicy" not in no_policy
