"""submit, schedule and upload through the real `kfp.Client` against a loopback KFP API stand-in."""

from __future__ import annotations

import pytest

from pipelines.cli import EXIT_WAIT_TIMEOUT, main
from tests.pipelines.kfp_standin import KfpStandIn


@pytest.fixture(autouse=True)
def no_ambient_kfp_settings(monkeypatch):
    for name in ("KFP_TOKEN", "KFP_TOKEN_PATH", "KF_PIPELINES_SA_TOKEN_PATH", "KFP_NAMESPACE", "KFP_UI_URL",
                 "KFP_SERVICE_ACCOUNT", "ALIGNFLOW_PIPELINE_ROOT"):
        monkeypatch.delenv(name, raising=False)


def pipeline_name(body: dict) -> str:
    """The pipeline's name in a create request (the spec is wrapped with its platform spec when it has one)."""
    spec = body["pipeline_spec"]
    return spec.get("pipeline_spec", spec)["pipelineInfo"]["name"]


def test_submit_sends_the_compiled_pipeline_with_parameters_and_waits(capsys):
    with KfpStandIn(run_states=("RUNNING", "RUNNING", "SUCCEEDED")) as kfp_api:
        code = main(["submit", "rlhf-dpo", "--host", kfp_api.host, "--param", "dpo_beta=0.2", "--param",
                     "sft_train_uri=s3://data/tiny.jsonl", "--experiment", "retrain", "--wait",
                     "--poll-seconds", "0.05"])
        assert code == 0
        [run] = kfp_api.sent("POST", "/apis/v2beta1/runs")
        body = run["body"]
        assert pipeline_name(body) == "rlhf-dpo"
        assert body["runtime_config"]["parameters"] == {"dpo_beta": 0.2, "sft_train_uri": "s3://data/tiny.jsonl"}
        assert body["experiment_id"] == kfp_api.experiments["retrain"]
        assert len(kfp_api.sent("GET", "/apis/v2beta1/runs/run-1")) == 3  # followed until it finished
    lines = capsys.readouterr().out.splitlines()
    submitted = lines.index(f"run run-1: submitted ({kfp_api.host}/#/runs/details/run-1)")  # before waiting
    assert lines[submitted + 1:] == [f"run run-1: SUCCEEDED ({kfp_api.host}/#/runs/details/run-1)"]


def test_the_experiment_names_kfps_experiment_and_mlflows_for_runs_and_schedules():
    """KFP 2.17's MLflow plugin reads `plugins_input.mlflow.experiment_name` (pipelines/run_requests.py)."""
    with KfpStandIn() as kfp_api:
        assert main(["submit", "rlhf-dpo", "--host", kfp_api.host, "--experiment", "dpo-sweeps"]) == 0
        assert main(["schedule", "rlhf-dpo", "--host", kfp_api.host, "--cron", "0 3 * * 1",
                     "--experiment", "nightly"]) == 0
        [run] = kfp_api.sent("POST", "/apis/v2beta1/runs")
        [recurring] = kfp_api.sent("POST", "/apis/v2beta1/recurringruns")
    assert run["body"]["experiment_id"] == kfp_api.experiments["dpo-sweeps"]
    assert run["body"]["plugins_input"] == {"mlflow": {"experiment_name": "dpo-sweeps"}}
    assert recurring["body"]["experiment_id"] == kfp_api.experiments["nightly"]
    assert recurring["body"]["plugins_input"] == {"mlflow": {"experiment_name": "nightly"}}
    assert recurring["body"]["mode"] == "ENABLE" and recurring["body"]["max_concurrency"] == 1


def test_an_api_before_kfp_2_17_gets_the_run_without_plugins_input(capsys, caplog):
    """It refuses the unknown field, which created nothing: the run is sent once more without it."""
    with KfpStandIn(before_plugins=True) as kfp_api:
        assert main(["submit", "rlhf-dpo", "--host", kfp_api.host, "--experiment", "dpo-sweeps"]) == 0
        assert main(["schedule", "rlhf-dpo", "--host", kfp_api.host, "--cron", "0 3 * * 1"]) == 0
        first, second = kfp_api.sent("POST", "/apis/v2beta1/runs")
        refused, accepted = kfp_api.sent("POST", "/apis/v2beta1/recurringruns")
    assert "plugins_input" in first["body"] and "plugins_input" not in second["body"]
    assert "plugins_input" in refused["body"] and "plugins_input" not in accepted["body"]
    assert second["body"]["experiment_id"] == kfp_api.experiments["dpo-sweeps"]
    assert "run run-1: submitted" in capsys.readouterr().out
    assert "older than KFP 2.17" in caplog.text


def test_only_a_refusal_naming_plugins_input_sends_the_run_again():
    from kfp_server_api.exceptions import ApiException

    from pipelines.run_requests import is_plugins_input_refused

    def refusal(status: int, message: str) -> ApiException:
        err = ApiException(status=status)
        err.body = message.encode()
        return err

    assert is_plugins_input_refused(refusal(400, '{"message": "proto: unknown field \\"plugins_input\\""}'))
    assert not is_plugins_input_refused(refusal(400, '{"message": "invalid runtime_config"}'))
    assert not is_plugins_input_refused(refusal(403, '{"message": "plugins_input: not allowed"}'))


def test_submit_wait_fails_when_the_run_fails(capsys):
    with KfpStandIn(run_states=("RUNNING", "FAILED")) as kfp_api:
        code = main(["submit", "rlhf-grpo", "--host", kfp_api.host, "--wait", "--poll-seconds", "0.05"])
    assert code == 1
    assert "run run-1: FAILED" in capsys.readouterr().out


def test_submit_wait_rides_out_transient_api_errors(capsys):
    """503s and a 429 while following the run are retried with backoff; the run's real end decides."""
    with KfpStandIn(run_states=("RUNNING", 503, 503, 429, "RUNNING", 502, "SUCCEEDED")) as kfp_api:
        code = main(["submit", "rlhf-dpo", "--host", kfp_api.host, "--wait", "--poll-seconds", "0.01"])
        assert len(kfp_api.sent("GET", "/apis/v2beta1/runs/run-1")) == 7
    assert code == 0
    assert "run run-1: SUCCEEDED" in capsys.readouterr().out


def test_submit_wait_stops_at_a_permanent_api_error(capsys):
    with KfpStandIn(run_states=("RUNNING", 403, "SUCCEEDED")) as kfp_api:
        code = main(["submit", "rlhf-dpo", "--host", kfp_api.host, "--wait", "--poll-seconds", "0.01"])
        assert len(kfp_api.sent("GET", "/apis/v2beta1/runs/run-1")) == 2  # no retry of a 403
    assert code == 2
    assert "submit rlhf-dpo failed" in capsys.readouterr().err


def test_submit_wait_timeout_prints_the_link_and_exits_3(capsys):
    with KfpStandIn(run_states=("RUNNING",)) as kfp_api:
        code = main(["submit", "rlhf-dpo", "--host", kfp_api.host, "--wait", "--timeout", "0.3",
                     "--poll-seconds", "0.05", "--ui-url", "https://kubeflow.example/pipeline"])
    assert code == EXIT_WAIT_TIMEOUT
    captured = capsys.readouterr()
    assert "run run-1: still running after 0.3 s (https://kubeflow.example/pipeline/#/runs/details/run-1)" \
        in captured.out
    assert "WaitTimeout" in captured.err


def test_token_file_is_read_again_before_every_call(tmp_path, monkeypatch, capsys):
    """A projected token rotates under a long --wait: each request carries the file's current content."""
    token = tmp_path / "token"
    token.write_text("first-token\n")
    monkeypatch.setenv("KFP_TOKEN_PATH", str(token))
    monkeypatch.setenv("KFP_TOKEN", "static-token-that-must-lose")

    def rotate(count: int) -> None:
        if count == 2:
            token.write_text("rotated-token")

    with KfpStandIn(run_states=("RUNNING", "RUNNING", "RUNNING", "SUCCEEDED"), on_get_run=rotate) as kfp_api:
        assert main(["submit", "rlhf-dpo", "--host", kfp_api.host, "--wait", "--poll-seconds", "0.01"]) == 0
        gets = [r["authorization"] for r in kfp_api.sent("GET", "/apis/v2beta1/runs/run-1")]
        [create] = kfp_api.sent("POST", "/apis/v2beta1/runs")
    assert create["authorization"] == "Bearer first-token"
    assert gets[:2] == ["Bearer first-token"] * 2 and gets[2:] == ["Bearer rotated-token"] * 2


def test_a_missing_token_file_fails_before_anything_is_sent(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("KFP_TOKEN_PATH", str(tmp_path / "absent"))
    with KfpStandIn() as kfp_api:
        assert main(["submit", "rlhf-dpo", "--host", kfp_api.host]) == 2
        assert kfp_api.requests == []
    assert f"KFP_TOKEN_PATH {tmp_path / 'absent'}: cannot read the KFP token" in capsys.readouterr().err


def test_namespace_reaches_experiments_runs_recurring_runs_and_uploads(monkeypatch):
    monkeypatch.setenv("KFP_NAMESPACE", "team-a")  # the chart's ConfigMap sets it; --namespace wins
    with KfpStandIn(multi_user=True) as kfp_api:
        assert main(["submit", "rlhf-dpo", "--host", kfp_api.host, "--service-account", "trainer-sa",
                     "--pipeline-root", "s3://team-a/runs"]) == 0
        assert main(["schedule", "rlhf-dpo", "--host", kfp_api.host, "--cron", "0 3 * * 1",
                     "--namespace", "team-b"]) == 0
        assert main(["upload", "rlhf-dpo", "--host", kfp_api.host]) == 0
        created = [r["body"]["namespace"] for r in kfp_api.sent("POST", "/apis/v2beta1/experiments")]
        [run] = kfp_api.sent("POST", "/apis/v2beta1/runs")
        [upload] = kfp_api.sent("POST", "/apis/v2beta1/pipelines/upload")
        [listing] = kfp_api.sent("GET", "/apis/v2beta1/pipelines")
    assert created == ["team-a", "team-b"]  # the run's experiment, then the schedule's
    assert run["body"]["service_account"] == "trainer-sa"
    assert run["body"]["runtime_config"]["pipeline_root"] == "s3://team-a/runs"
    assert upload["query"]["namespace"] == ["team-a"] and listing["query"]["namespace"] == ["team-a"]


def test_schedule_creates_a_recurring_run_with_a_seconds_field():
    with KfpStandIn() as kfp_api:
        assert main(["schedule", "rlhf-ppo", "--host", kfp_api.host, "--cron", "0 3 * * 1",
                     "--param", "ppo_episodes=80"]) == 0
        [request] = kfp_api.sent("POST", "/apis/v2beta1/recurringruns")
    body = request["body"]
    assert body["trigger"]["cron_schedule"]["cron"] == "0 0 3 * * 1"
    assert body["runtime_config"]["parameters"] == {"ppo_episodes": 80}
    assert pipeline_name(body) == "rlhf-ppo"


def test_scheduling_again_replaces_the_recurring_run_instead_of_adding_one(capsys):
    """What `helm upgrade` does: the same name, a new schedule; afterwards exactly one recurring run."""
    with KfpStandIn() as kfp_api:
        assert main(["schedule", "rlhf-ppo", "--host", kfp_api.host, "--cron", "0 3 * * 1", "--name", "af-retrain",
                     "--experiment", "retrain"]) == 0
        [first] = kfp_api.recurring_runs
        assert main(["schedule", "rlhf-ppo", "--host", kfp_api.host, "--cron", "0 4 * * 2", "--name", "af-retrain",
                     "--experiment", "retrain"]) == 0
        assert main(["schedule", "rlhf-dpo", "--host", kfp_api.host, "--cron", "0 5 * * *",
                     "--experiment", "retrain"]) == 0  # another name: left alone
        assert sorted(r["display_name"] for r in kfp_api.recurring_runs.values()) == ["af-retrain", "rlhf-dpo-retrain"]
        [delete] = [r for r in kfp_api.requests if r["method"] == "DELETE"]
        creates = kfp_api.sent("POST", "/apis/v2beta1/recurringruns")
        assert kfp_api.requests.index(creates[1]) < kfp_api.requests.index(delete)  # the new one exists first
    assert delete["path"].endswith(f"/{first}")
    assert creates[1]["body"]["trigger"]["cron_schedule"]["cron"] == "0 0 4 * * 2"
    assert f"(replaced {first})" in capsys.readouterr().out


def test_upload_creates_a_pipeline_then_adds_versions():
    with KfpStandIn() as kfp_api:
        assert main(["upload", "rlhf-dpo", "--host", kfp_api.host]) == 0
        assert main(["upload", "rlhf-dpo", "--host", kfp_api.host, "--version", "v2"]) == 0
        assert len(kfp_api.sent("POST", "/apis/v2beta1/pipelines/upload")) == 1
        [version] = kfp_api.sent("POST", "/apis/v2beta1/pipelines/upload_version")
    assert version["query"]["name"] == ["v2"] and version["query"]["pipelineid"] == ["p-1"]


@pytest.mark.parametrize(("argv", "message"), [
    (["schedule", "rlhf-ppo", "--host", "http://127.0.0.1:9", "--cron", "daily"], "--cron 'daily': expected 5 fields"),
    (["submit", "rlhf-cpo", "--host", "http://127.0.0.1:9"], "unknown pipeline 'rlhf-cpo'"),
    (["submit", "rlhf-dpo", "--host", "http://127.0.0.1:9", "--param", "beta"], "--param 'beta'"),
    (["submit", "rlhf-dpo", "--host", "http://127.0.0.1:9", "--param", "source=s3://x"],
     "rlhf-dpo has no parameter(s) ['source']"),
    (["submit", "--host", "http://127.0.0.1:9"], "submit: name a pipeline"),
])
def test_bad_arguments_fail_before_anything_is_sent(argv, message, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_submit_without_host_is_an_argument_error(capsys):
    with pytest.raises(SystemExit):
        main(["submit", "rlhf-dpo"])
    assert "--host" in capsys.readouterr().err


def test_unreachable_server_is_one_clear_error(capsys):
    from tests.integration.services import free_port

    assert main(["submit", "rlhf-dpo", "--host", f"http://127.0.0.1:{free_port()}"]) == 2
    assert "submit rlhf-dpo failed" in capsys.readouterr().err
