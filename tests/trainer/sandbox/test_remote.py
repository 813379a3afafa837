"""The remote client against the real sandbox service on loopback: the same results as the local sandbox."""

from __future__ import annotations

import pytest

from tests.trainer.sandbox.conftest import TOKEN
from trainer.sandbox import RemoteSandbox, SandboxConfig, SandboxError, SandboxLimits, SandboxUnavailableError
from trainer.sandbox import build_sandbox as build

PROGRAMS = {
    "computes": "import math\nprint(math.comb(40, 20))\nprint('note', file=__import__('sys').stderr)",
    "fails": "raise KeyError('missing')",
    "no network": "import socket\nsocket.create_connection(('127.0.0.1', 9), timeout=1)",
    "floods": "import sys\nwhile True:\n    sys.stdout.write('y' * 65536)",
    "sleeps": "import time\ntime.sleep(100)",
}
LIMITS = SandboxLimits(wall_seconds=1, max_output_bytes=100_000)


@pytest.mark.parametrize("program", PROGRAMS)
def test_same_results_as_the_local_sandbox(sandbox_service, stand_in, program):
    url, _ = sandbox_service
    remote = build(SandboxConfig(backend="remote", url=url), environ={"ALIGNFLOW_SANDBOX_TOKEN": TOKEN})
    result = remote.run_python(PROGRAMS[program], limits=LIMITS).to_dict()
    local = stand_in.run(PROGRAMS[program], **LIMITS.model_dump())
    local.pop("seconds")
    if program == "fails":
        assert "KeyError: 'missing'" in result["stderr"]
    assert result == local


def test_check_accepts_the_token_and_limits_within_the_service(sandbox_service):
    url, _ = sandbox_service
    RemoteSandbox(url, TOKEN).check(SandboxLimits(wall_seconds=20))
    with pytest.raises(SandboxUnavailableError, match="limits.wall_seconds is 30.0, the service allows at most 20.0"):
        RemoteSandbox(url, TOKEN).check(SandboxLimits(wall_seconds=30))
    with pytest.raises(SandboxUnavailableError, match="HTTP 401 Unauthorized: missing or wrong bearer token"):
        RemoteSandbox(url, "wrong").check()


def test_the_token_never_shows(sandbox_service):
    url, _ = sandbox_service
    sandbox = RemoteSandbox(url, TOKEN)
    assert TOKEN not in repr(sandbox) and TOKEN not in str(vars(sandbox).get("url"))
    with pytest.raises(SandboxError) as raised:
        sandbox.run_python("print(1)", limits=SandboxLimits(wall_seconds=100))
    assert TOKEN not in str(raised.value) and "limits.wall_seconds" in str(raised.value)


def test_a_missing_token_or_url_is_named_before_any_request():
    with pytest.raises(SandboxUnavailableError, match="token variable SANDBOX_KEY is empty or unset"):
        build(SandboxConfig(backend="remote", url="http://127.0.0.1:9", token_env="SANDBOX_KEY"), environ={})
    with pytest.raises(ValueError, match="url is required when backend is remote"):
        SandboxConfig(backend="remote")


def test_an_unreachable_service_is_one_clear_error_after_the_retries():
    with pytest.raises(SandboxUnavailableError, match=r"^GET http://127.0.0.1:9/v1/limits: the sandbox service kept "
                                                      r"failing \(ConnectionRefusedError: .*\) after 2 retries$"):
        RemoteSandbox("http://127.0.0.1:9", TOKEN, max_retries=2, backoff_seconds=0.01).check()

