"""submit, schedule and upload through the real `kfp.Client` against a loopback KFP API stand-in."""

from __future__ import annotations

import pytest

from pipelines.cli import main
from tests.pipelines.kfp_standin import KfpStandIn


def test_submit_sends_the_compiled_pipeline_with_parameters_and_waits(capsys):
    with KfpStandIn(run_states=("RUNNING", "RUNNING", "SUCCEEDED")) as kfp_api:
        code = main(["submit", "rlhf-dpo", "--host", kfp_api.host, "--param", "dpo_beta=0.2", "--param",
                     "source=s3://data/tiny", "--experiment", "retrain", "--wait", "--poll-seconds", "0.05"])
        assert code == 0
        [run] = kfp_api.sent("POST", "/apis/v2beta1/runs")
        body = run["body"]
        assert body["pipeline_spec"]["pipelineInfo"]["name"] == "rlhf-dpo"
        assert body["runtime_config"]["parameters"] == {"dpo_beta": 0.2, "source": "s3://data/tiny"}
        assert body["experiment_id"] == kfp_api.experiments["retrain"]
        assert len(kfp_api.sent("GET", "/apis/v2beta1/runs/run-1")) == 3  # followed until it finished
    assert "run run-1: SUCCEEDED" in capsys.readouterr().out


def test_submit_wait_fails_when_the_run_fails(capsys):
    with KfpStandIn(run_states=("RUNNING", "FAILED")) as kfp_api:
        code = main(["submit", "rlhf-grpo", "--host", kfp_api.host, "--wait", "--poll-seconds", "0.05"])
    assert code == 1
    assert "run run-1: FAILED" in capsys.readouterr().out


def test_schedule_creates_a_recurring_run_with_a_seconds_field():
    with KfpStandIn() as kfp_api:
        assert main(["schedule", "rlhf-ppo", "--host", kfp_api.host, "--cron", "0 3 * * 1",
                     "--param", "ppo_episodes=80"]) == 0
        [request] = kfp_api.sent("POST", "/apis/v2beta1/recurringruns")
    body = request["body"]
    assert body["trigger"]["cron_schedule"]["cron"] == "0 0 3 * * 1"
    assert body["runtime_config"]["parameters"] == {"ppo_episodes": 80}
    assert body["pipeline_spec"]["pipelineInfo"]["name"] == "rlhf-ppo"


def test_upload_creates_a_pipeline_then_adds_versions():
    with KfpStandIn() as kfp_api:
        assert main(["upload", "rlhf-dpo", "--host", kfp_api.host]) == 0
        assert main(["upload", "rlhf-dpo", "--host", kfp_api.host, "--version", "v2"]) == 0
        assert len(kfp_api.sent("POST", "/apis/v2beta1/pipelines/upload")) == 1
        [version] = kfp_api.sent("POST", "/apis/v2beta1/pipelines/upload_version")
    assert version["query"]["name"] == ["v2"] and version["query"]["pipelineid"] == ["p-1"]


@pytest.mark.parametrize(("argv", "message"), [
    (["schedule", "rlhf-ppo", "--host", "http://127.0.0.1:9", "--cron", "daily"], "--cron 'daily': expected 5 fields"),
    (["submit", "rlhf-kto", "--host", "http://127.0.0.1:9"], "unknown pipeline 'rlhf-kto'"),
    (["submit", "rlhf-dpo", "--host", "http://127.0.0.1:9", "--param", "beta"], "--param 'beta'"),
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
