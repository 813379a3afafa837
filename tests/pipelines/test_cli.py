"""The `alignflow` CLI: compile, and clear errors for bad arguments."""

from __future__ import annotations

import pytest

from pipelines.cli import main, parse_params
from trainer.errors import PipelineError


def test_compile_writes_a_package(tmp_path, capsys):
    output = tmp_path / "out.yaml"
    assert main(["compile", "rlhf-dpo", "-o", str(output)]) == 0
    assert "pipelineInfo" in output.read_text()


def test_unknown_pipeline_is_a_clear_error(tmp_path, capsys):
    assert main(["compile", "rlhf-cpo", "-o", str(tmp_path / "x.yaml")]) == 2
    assert "unknown pipeline 'rlhf-cpo'" in capsys.readouterr().err


def test_params_are_json_when_they_parse():
    assert parse_params(["a=1", "b=0.5", "c=true", "d=text", 'e={"k": 2}']) == {
        "a": 1, "b": 0.5, "c": True, "d": "text", "e": {"k": 2}}


def test_param_without_equals_names_the_flag():
    with pytest.raises(PipelineError, match="--param 'beta': expected key=value"):
        parse_params(["beta"])


def test_missing_output_flag_is_an_argument_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["compile", "rlhf-dpo"])
    assert exit_info.value.code == 2
    assert "-o/--output" in capsys.readouterr().err


@pytest.mark.parametrize(("command", "value", "expected"), [
    ("submit", '{"cpu_request": "eight"}', "LaunchError: parameter scheduling.cpu_request is 'eight', expected a "
                                           "Kubernetes quantity"),
    ("submit", '{"memory": "8Gi"}', "LaunchError: parameter scheduling has unknown key(s) memory"),
    ("run", "{cpu_request: 8}", "LaunchError: parameter scheduling is not valid JSON"),
])
def test_a_bad_scheduling_parameter_fails_before_anything_runs_or_is_sent(command, value, expected, tmp_path, capsys):
    # The host does not exist: the check must come before any connection (and, for run, any local task).
    where = ["--host", "http://127.0.0.1:9"] if command == "submit" else ["--root", str(tmp_path)]
    assert main([command, "rlhf-dpo", *where, "--param", f"scheduling={value}"]) == 2
    assert expected in capsys.readouterr().err
    assert not any(tmp_path.iterdir())
