"""The Helm chart, rendered by the real Helm engine (helm-python-sdk): lint, schema, strict manifests, documentation."""

from __future__ import annotations

import pytest
import yaml

from tests.helm.chart import CHART, KUBERNETES_VERSION, OVERRIDES, render


@pytest.mark.parametrize("values", OVERRIDES.values(), ids=OVERRIDES.keys())
def test_chart_lints_clean(values):
    import helm_python

    report = helm_python.lint(str(CHART), values, strict=True)
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


@pytest.mark.parametrize("values", OVERRIDES.values(), ids=OVERRIDES.keys())
def test_every_manifest_passes_strict_kubernetes_validation(values):
    """Core kinds against Kubernetes' schemas; Kubeflow Trainer's runtimes against their vendored CRDs."""
    import kubernetes_validate

    from tests.schemas import problems

    documents = render(values)
    assert documents
    for document in documents:
        if document["apiVersion"].startswith("trainer.kubeflow.org/"):
            assert problems(f"{document['kind'].lower()}s.trainer.kubeflow.org", document) == [], document["kind"]
        else:
            kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)


def test_secrets_are_referenced_by_name_never_embedded():
    documents = render(OVERRIDES["mlflow-sqlite-and-cron-retrain"])
    assert not any(d["kind"] == "Secret" for d in documents)
    text = yaml.safe_dump_all(documents)
    assert "secretKeyRef" in text and "name: s3-credentials" in text


def test_unknown_value_is_rejected_by_the_schema():
    import helm_python

    with pytest.raises(helm_python.HelmValuesError, match="additional properties 'mlfow' not allowed"):
        render({"mlfow": {"enabled": True}})


@pytest.mark.parametrize(("values", "sentence"), [
    ({"mlflow": {"enabled": True, "backend": {"type": "postgres"}}, "s3": {"credentialsSecret": "s"}},
     "mlflow.backend.postgresSecret is empty"),
    ({"extraVolumes": [{"name": "host", "hostPath": {"path": "/var/run"}}]},
     'volume "host" is of type hostPath, which the Pod Security "restricted" profile forbids'),
    ({"uploadPipelines": {"pipelines": []}}, "uploadPipelines.pipelines is empty and no recurring run is created"),
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
