"""The optional MLflow server as rendered: the database URI only through the environment, S3 through IRSA."""

from __future__ import annotations

import re
from pathlib import Path

from tests.helm.chart import one, render

POSTGRES = {"mlflow": {"enabled": True, "backend": {"type": "postgres", "postgresSecret": "mlflow-db"}},
            "s3": {"credentialsSecret": "s3-credentials"}}
LOCK = Path(__file__).parents[2] / "constraints.txt"  # the lock the MLflow image installs through


def mlflow_container(values: dict) -> dict:
    [container] = one(render(values), "Deployment")["spec"]["template"]["spec"]["containers"]
    return container


def mlflow_server_option_env(option: str) -> str:
    """The environment variable the installed `mlflow server` reads for `option` (click's envvar)."""
    from mlflow.cli import server

    [parameter] = [p for p in server.params if option in p.opts]
    return parameter.envvar


def test_postgres_uri_comes_from_the_secret_as_an_environment_variable_mlflow_reads():
    container = mlflow_container(POSTGRES)
    env = {item["name"]: item for item in container["env"]}
    name = mlflow_server_option_env("--backend-store-uri")
    assert env[name] == {"name": name, "valueFrom": {"secretKeyRef": {"name": "mlflow-db", "key": "uri"}}}


def test_no_database_uri_in_the_arguments():
    """Arguments show in `ps` and in the pod spec; no option, value or `$(VAR)` reference carries the URI."""
    container = mlflow_container(POSTGRES)
    argv = " ".join(container["command"] + container["args"])
    assert "backend-store-uri" not in argv and "postgres" not in argv and "$(" not in argv


def test_sqlite_backend_is_a_file_on_the_volume():
    container = mlflow_container({"mlflow": {"enabled": True}})
    env = {item["name"]: item.get("value") for item in container["env"]}
    assert env["MLFLOW_BACKEND_STORE_URI"] == "sqlite:////mlflow/mlflow.db"
    assert {"name": "data", "mountPath": "/mlflow"} in container["volumeMounts"]


def test_s3_artifacts_without_a_credentials_secret_use_the_service_accounts_role():
    """IRSA / instance roles: no Secret, an annotated ServiceAccount of the server's own, no AWS keys in env."""
    role = "arn:aws:iam::111122223333:role/af-mlflow"
    documents = render({"mlflow": {"enabled": True, "serviceAccount": {
        "annotations": {"eks.amazonaws.com/role-arn": role}}}})
    spec = one(documents, "Deployment")["spec"]["template"]["spec"]
    [account] = [d for d in documents if d["kind"] == "ServiceAccount" and d["metadata"]["name"] == spec[
        "serviceAccountName"]]
    assert account["metadata"]["annotations"] == {"eks.amazonaws.com/role-arn": role}
    assert spec["serviceAccountName"] != "af-alignflow"  # not the launcher's, which holds the Role
    assert spec["automountServiceAccountToken"] is False
    [container] = spec["containers"]
    assert not {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} & {item["name"] for item in container["env"]}
    assert "--artifacts-destination=s3://alignflow/mlflow" in container["args"]


def test_allowed_hosts_default_to_the_service_names_and_the_external_url():
    args = mlflow_container({"mlflow": {"enabled": True, "externalUrl": "https://mlflow.corp.example/"}})["args"]
    [hosts] = [arg.split("=", 1)[1].split(",") for arg in args if arg.startswith("--allowed-hosts=")]
    assert {"af-alignflow-mlflow.ml.svc:5000", "af-alignflow-mlflow:5000", "localhost:*",
            "mlflow.corp.example"} <= set(hosts)
    assert "*" not in hosts
    assert "--allowed-hosts=mlflow.corp.example" in mlflow_container(
        {"mlflow": {"enabled": True, "allowedHosts": "mlflow.corp.example"}})["args"]


def test_default_image_is_the_projects_mlflow_image_with_the_pinned_version():
    container = mlflow_container({"mlflow": {"enabled": True}})
    [pinned] = re.findall(r"^mlflow==([0-9.]+)$", LOCK.read_text(), re.MULTILINE)
    assert container["image"] == f"ghcr.io/alignflow/mlflow:{pinned}"
