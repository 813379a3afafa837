"""Values applied to every pod of the chart: extra env, volumes and mounts; ServiceAccount annotations."""

from __future__ import annotations

from tests.helm.chart import EVERYTHING, containers, one, pods, render


def test_extra_env_volumes_and_mounts_reach_every_pod_and_container():
    documents = render(EVERYTHING)
    rendered = list(pods(documents))
    assert {where.split("/")[0] for where, _ in rendered} == {"Deployment", "Job", "CronJob"}
    for where, spec in rendered:
        assert {"name": "corp-ca", "configMap": {"name": "corp-ca"}} in spec["volumes"], where
        for container in containers(spec):
            assert {"name": "HTTPS_PROXY", "value": "http://proxy:3128"} in container["env"], where
            assert {"name": "corp-ca", "mountPath": "/etc/ssl/corp", "readOnly": True} in container[
                "volumeMounts"], where


def test_service_account_annotations_for_irsa():
    role = "arn:aws:iam::111122223333:role/alignflow"
    documents = render({"serviceAccount": {"annotations": {"eks.amazonaws.com/role-arn": role}}})
    [account] = [d for d in documents if d["kind"] == "ServiceAccount"]
    assert account["metadata"]["annotations"] == {"eks.amazonaws.com/role-arn": role}
    assert one(documents, "Job")["spec"]["template"]["spec"]["serviceAccountName"] == account["metadata"]["name"]


def test_no_credentials_secret_means_no_aws_keys_in_any_pod():
    documents = render({"mlflow": {"enabled": True}, "retrain": {"enabled": True, "mode": "cronJob"}})
    for where, spec in pods(documents):
        for container in containers(spec):
            names = {item["name"] for item in container.get("env", [])}
            assert not names & {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}, where
