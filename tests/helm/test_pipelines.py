"""The upload Job and the retrain CronJob run `alignflow` without a shell: values reach it as data.

A container runtime execs `command + args` as they are; the only rewriting before that is the kubelet's
`$(NAME)` expansion, reproduced by `expand_kubelet_references` (tests/helm/chart.py). The tests then exec the rendered argv
with `alignflow` replaced by a stand-in that parses it with the real CLI parser and records what it got.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helm.chart import containers, expand_kubelet_references, one, pods, render

HOSTILE = {
    "single": "it's'; touch single-quote-marker; echo '",
    "double": 'say "hi"; touch double-quote-marker',
    "subshell": "$(touch subshell-marker)",
    "backticks": "`touch backtick-marker`",
    "newline": "first line\ntouch newline-marker\n",
    "env_reference": "$(AWS_SECRET_ACCESS_KEY)",  # the kubelet would substitute the Secret's value
    "dollars": "$$ $ $(",
    "nested": {"quote": "'", "list": ["$(HOME)", "a\nb"]},
    "number": 0.2,
}
HOSTILE_HOST = "http://kfp.example/'$(touch host-marker)'"
SECRET_VALUES = {"AWS_ACCESS_KEY_ID": "AKIA-TEST", "AWS_SECRET_ACCESS_KEY": "the-secret-value"}

# Stand-in for `alignflow`: parses its argv with the real CLI parser and writes what it received.
STAND_IN = """\
import json, sys
from pipelines.cli import build_parser, parse_params
args = build_parser().parse_args(sys.argv[1:])
record = {"argv": sys.argv[1:], "command": args.command, "pipeline": args.pipeline, "host": args.host,
          "params": parse_params(getattr(args, "param", [])), "cron": getattr(args, "cron", None),
          "wait": getattr(args, "wait", None), "version": getattr(args, "version", None)}
with open("received.jsonl", "a") as out:
    out.write(json.dumps(record) + "\\n")
"""


def container_variables(container: dict, config_map: dict) -> dict[str, str]:
    """What the kubelet may substitute: the ConfigMap loaded by envFrom, then env (Secrets resolved)."""
    variables = dict(config_map["data"]) if container.get("envFrom") else {}
    for item in container.get("env", []):
        if "value" in item:
            variables[item["name"]] = expand_kubelet_references(item["value"], variables)
        else:
            variables[item["name"]] = SECRET_VALUES.get(item["valueFrom"].get("secretKeyRef", {}).get("key"), "")
    return variables


def exec_as_the_runtime_would(container: dict, config_map: dict, workdir: Path) -> dict:
    """Exec the container's argv (no shell) with a stand-in program; returns what the program received."""
    assert container["command"] == ["alignflow"], f"{container['name']}: {container['command']}"
    variables = container_variables(container, config_map)
    argv = [expand_kubelet_references(arg, variables) for arg in container["args"]]
    stand_in = workdir / "alignflow_stand_in.py"
    stand_in.write_text(STAND_IN)
    environment = {"PATH": os.environ["PATH"], "PYTHONPATH": str(Path(__file__).parents[2]), **variables}
    subprocess.run([sys.executable, str(stand_in), *argv], cwd=workdir, env=environment, check=True, timeout=60)
    *_, last = (workdir / "received.jsonl").read_text().splitlines()
    return json.loads(last)


def chart_params(**overrides) -> dict:
    """The pipeline parameters the chart adds to every retrain, then `retrain.params`."""
    return {"launcher_mode": "kubernetes", "trainer_image": "ghcr.io/alignflow/trainer:latest",
            "s3_secret": "s3-credentials", **overrides}


def no_markers(workdir: Path) -> list[str]:
    return sorted(path.name for path in workdir.iterdir() if path.name.endswith("-marker"))


def test_no_container_of_the_jobs_runs_a_shell():
    for values in ({"retrain": {"enabled": True, "mode": "cronJob"}},
                   {"retrain": {"enabled": True, "mode": "recurringRun"}}):
        for where, spec in pods(render(values)):
            for container in containers(spec):
                program = Path((container.get("command") or ["?"])[0]).name
                assert program not in ("sh", "bash", "dash", "ash", "zsh"), f"{where}/{container['name']}"
                assert "-c" not in container.get("args", [])[:1] and "-ec" not in container.get("command", [])


def test_retrain_cronjob_passes_hostile_params_to_alignflow_as_data(tmp_path):
    values = {"retrain": {"enabled": True, "mode": "cronJob", "params": HOSTILE, "schedule": "*/5 * * * *"},
              "kfp": {"host": HOSTILE_HOST}, "s3": {"credentialsSecret": "s3-credentials"}}
    documents = render(values)
    spec = one(documents, "CronJob")["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    [container] = containers(spec)
    received = exec_as_the_runtime_would(container, one(documents, "ConfigMap"), tmp_path)
    assert received["command"] == "submit" and received["pipeline"] == "rlhf-ppo" and received["wait"] is True
    assert received["host"] == HOSTILE_HOST
    assert received["params"] == chart_params(**HOSTILE)
    assert no_markers(tmp_path) == []


def test_upload_job_uploads_in_order_then_schedules_with_hostile_params_as_data(tmp_path):
    schedule = "0 3 * * 1"
    values = {"retrain": {"enabled": True, "mode": "recurringRun", "params": HOSTILE, "schedule": schedule},
              "kfp": {"host": HOSTILE_HOST}, "s3": {"credentialsSecret": "s3-credentials"}}
    documents = render(values)
    spec = one(documents, "Job")["spec"]["template"]["spec"]
    config_map = one(documents, "ConfigMap")
    received = [exec_as_the_runtime_would(container, config_map, tmp_path) for container in containers(spec)]
    # init containers run in order; the pod fails at the first that fails
    assert [(r["command"], r["pipeline"]) for r in received] == [
        ("upload", "rlhf-ppo"), ("upload", "rlhf-dpo"), ("upload", "rlhf-grpo"), ("schedule", "rlhf-ppo")]
    assert {r["host"] for r in received} == {HOSTILE_HOST}
    assert {r["version"] for r in received[:3]} == {"0.1.0-1"}
    assert received[-1]["cron"] == schedule and received[-1]["params"] == chart_params(**HOSTILE)
    assert no_markers(tmp_path) == []


def test_upgrade_uploads_new_versions_and_replaces_the_recurring_run_by_name():
    """`alignflow schedule` replaces a recurring run of the same name (tests/pipelines/test_remote.py), so an
    upgrade updates the schedule without adding a second one."""
    documents = render({"retrain": {"enabled": True, "mode": "recurringRun"}}, upgrade_to=7)
    spec = one(documents, "Job")["spec"]["template"]["spec"]
    assert [c["args"][:2] for c in containers(spec)] == [["upload", "rlhf-ppo"], ["upload", "rlhf-dpo"],
                                                          ["upload", "rlhf-grpo"], ["schedule", "rlhf-ppo"]]
    assert {c["args"][-1] for c in containers(spec)[:3]} == {"--version=0.1.0-7"}
    assert "--name=af-alignflow-retrain" in containers(spec)[-1]["args"]


def test_the_stand_in_would_see_an_unescaped_secret_reference(tmp_path):
    """The kubelet expansion the tests reproduce is real: an unescaped reference becomes the Secret."""
    container = {"name": "probe", "command": ["alignflow"], "envFrom": [],
                 "args": ["submit", "rlhf-ppo", "--host=http://kfp", "--param=leak=$(AWS_SECRET_ACCESS_KEY)"],
                 "env": [{"name": "AWS_SECRET_ACCESS_KEY", "valueFrom": {"secretKeyRef": {
                     "name": "s3-credentials", "key": "AWS_SECRET_ACCESS_KEY"}}}]}
    received = exec_as_the_runtime_would(container, {"data": {}}, tmp_path)
    assert received["params"] == {"leak": "the-secret-value"}
    assert expand_kubelet_references("$$(A) $(A) $(B) $x $( $", {"A": "1"}) == "$(A) 1 $(B) $x $( $"


def test_multi_user_jobs_read_a_projected_kfp_token_with_the_pipelines_audience():
    values = {"kfp": {"multiUser": {"enabled": True, "namespace": "team-a"}},
              "retrain": {"enabled": True, "mode": "cronJob"}}
    documents = render(values)
    job_pods = [(where, spec) for where, spec in pods(documents) if where.split("/")[0] in ("Job", "CronJob")]
    assert len(job_pods) == 2
    for where, spec in job_pods:
        [volume] = [v for v in spec["volumes"] if "projected" in v]
        [source] = volume["projected"]["sources"]
        assert source["serviceAccountToken"]["audience"] == "pipelines.kubeflow.org", where
        for container in containers(spec):
            [mount] = [m for m in container["volumeMounts"] if m["name"] == volume["name"]]
            env = {e["name"]: e.get("value") for e in container["env"]}
            token_file = f"{mount['mountPath']}/{source['serviceAccountToken']['path']}"
            assert env["KFP_TOKEN_PATH"] == env["KF_PIPELINES_SA_TOKEN_PATH"] == token_file, where
            assert mount["readOnly"] is True
    assert one(documents, "ConfigMap")["data"]["KFP_NAMESPACE"] == "team-a"
    [binding] = [d for d in documents if d["kind"] == "RoleBinding" and d["roleRef"]["kind"] == "ClusterRole"]
    assert binding["metadata"]["namespace"] == "team-a"
    assert binding["roleRef"]["name"] == "kubeflow-pipelines-edit"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "af-alignflow", "namespace": "ml"}]


def test_single_user_jobs_mount_no_token_and_name_no_namespace():
    documents = render({"retrain": {"enabled": True, "mode": "cronJob"}})
    for where, spec in pods(documents):
        assert "volumes" not in spec, where
        assert spec["automountServiceAccountToken"] is False, where
    assert one(documents, "ConfigMap")["data"]["KFP_NAMESPACE"] == ""


@pytest.mark.parametrize("key", ["bad key", "a=b", "-x"])
def test_param_names_that_would_not_parse_as_key_value_are_rejected(key):
    import helm_python

    with pytest.raises(helm_python.HelmValuesError):
        render({"retrain": {"enabled": True, "params": {key: 1}}})


@pytest.mark.parametrize("pipeline", ["rlhf-ppo", "rlhf-dpo", "rlhf-grpo"])
def test_the_parameters_the_chart_adds_are_parameters_of_the_pipeline(pipeline):
    """KFP refuses a run with an unknown parameter: what the chart always passes must exist in each pipeline (its
    inputs as KFP reads them: its own parameters and those every pipeline takes, pipelines/parameters.py)."""
    from pipelines.catalog import get_pipeline

    assert set(chart_params()) <= set(get_pipeline(pipeline).component_spec.inputs)
