"""The Helm chart, rendered by the real Helm engine (helm-python-sdk): lint, schema, manifests, RBAC."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

CHART = Path(__file__).parents[2] / "helm" / "alignflow"
KUBERNETES_VERSION = "1.30.0"

OVERRIDES = {
    "defaults": {},
    "mlflow-sqlite-and-cron-retrain": {
        "mlflow": {"enabled": True}, "s3": {"credentialsSecret": "s3-credentials", "endpoint": "http://minio:9000"},
        "retrain": {"enabled": True, "mode": "cronJob", "params": {"source": "s3://alignflow/data"}},
        "gpu": {"nodeSelector": {"nvidia.com/gpu.present": "true"},
                "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]},
    },
    "mlflow-postgres-and-recurring-run": {
        "mlflow": {"enabled": True, "backend": {"type": "postgres", "postgresSecret": "mlflow-db"}},
        "s3": {"credentialsSecret": "s3-credentials"}, "retrain": {"enabled": True, "mode": "recurringRun"},
    },
    "external-mlflow-no-upload": {"mlflow": {"trackingUri": "http://mlflow.tools:5000"},
                                  "uploadPipelines": {"enabled": False}, "serviceAccount": {"create": False,
                                                                                            "name": "existing"}},
}


def render(values: dict) -> list[dict]:
    import helm_python

    chart = helm_python.Chart.load(str(CHART))
    rendered = chart.render(values, name="af", namespace="ml", is_install=True)
    return [doc for path, text in rendered.items() if path.endswith(".yaml")
            for doc in yaml.safe_load_all(text) if doc]


@pytest.mark.parametrize("values", OVERRIDES.values(), ids=OVERRIDES.keys())
def test_chart_lints_clean(values):
    import helm_python

    report = helm_python.lint(str(CHART), values, strict=True)
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


@pytest.mark.parametrize("values", OVERRIDES.values(), ids=OVERRIDES.keys())
def test_every_manifest_passes_strict_kubernetes_validation(values):
    import kubernetes_validate

    documents = render(values)
    assert documents
    for document in documents:
        kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)


def test_role_grants_only_what_the_launcher_needs():
    [role] = [d for d in render({}) if d["kind"] == "Role"]
    granted = {(group, resource, verb) for rule in role["rules"] for group in rule["apiGroups"]
               for resource in rule["resources"] for verb in rule["verbs"]}
    allowed = {("kubeflow.org", "pytorchjobs", verb) for verb in ("create", "get", "list", "watch", "delete")}
    allowed |= {("kubeflow.org", "pytorchjobs/status", "get")}
    allowed |= {("", resource, verb) for resource in ("pods", "pods/log", "events") for verb in ("get", "list", "watch")}
    assert granted <= allowed
    assert ("kubeflow.org", "pytorchjobs", "create") in granted and ("", "pods/log", "get") in granted
    assert not any(d["kind"] in ("ClusterRole", "ClusterRoleBinding") for d in render({}))


def test_secrets_are_referenced_by_name_never_embedded():
    documents = render(OVERRIDES["mlflow-sqlite-and-cron-retrain"])
    assert not any(d["kind"] == "Secret" for d in documents)
    text = yaml.safe_dump_all(documents)
    assert "secretKeyRef" in text and "name: s3-credentials" in text


def test_retrain_modes_render_a_cronjob_or_a_recurring_run():
    cron = render(OVERRIDES["mlflow-sqlite-and-cron-retrain"])
    [cronjob] = [d for d in cron if d["kind"] == "CronJob"]
    command = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["args"][0]
    assert "alignflow submit rlhf-ppo" in command and "--wait" in command and "source=" in command
    recurring = render(OVERRIDES["mlflow-postgres-and-recurring-run"])
    [upload] = [d for d in recurring if d["kind"] == "Job"]
    script = upload["spec"]["template"]["spec"]["containers"][0]["args"][0]
    assert "alignflow upload rlhf-dpo" in script and "alignflow schedule rlhf-ppo" in script


def test_unknown_value_is_rejected_by_the_schema():
    import helm_python

    with pytest.raises(helm_python.HelmValuesError, match="additional properties 'mlfow' not allowed"):
        render({"mlfow": {"enabled": True}})


@pytest.mark.parametrize(("values", "sentence"), [
    ({"mlflow": {"enabled": True, "backend": {"type": "postgres"}}, "s3": {"credentialsSecret": "s"}},
     "mlflow.backend.postgresSecret is empty"),
    ({"mlflow": {"enabled": True}}, "the MLflow server needs S3 credentials"),
])
def test_invalid_combinations_fail_with_a_sentence(values, sentence):
    import helm_python

    with pytest.raises(helm_python.HelmRenderError, match=sentence):
        render(values)


def test_every_value_is_documented():
    """Each key with a value has a `# --` comment above it or above one of its parent keys."""
    documented: dict[int, bool] = {}  # indentation -> whether the open key at that depth is documented
    previous = ""
    for number, line in enumerate((CHART / "values.yaml").read_text().splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#") and not stripped.startswith("# --"):
            continue
        if stripped.startswith("# --"):
            previous = stripped
            continue
        indent = len(line) - len(line.lstrip())
        documented = {depth: flag for depth, flag in documented.items() if depth < indent}
        here = previous.startswith("# --") or any(documented.values())
        if not stripped.endswith(":"):
            assert here, f"values.yaml:{number}: {stripped} has no '# --' comment"
        documented[indent] = here
        previous = stripped


def test_strict_validation_catches_a_misspelled_field():
    import kubernetes_validate

    [role] = [d for d in render({}) if d["kind"] == "Role"]
    role["rules"][0]["verb"] = role["rules"][0].pop("verbs")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(role, KUBERNETES_VERSION, strict=True)
