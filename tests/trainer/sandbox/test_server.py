"""The sandbox service over real HTTP on loopback: the token is required, bad requests get one clear error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from tests.trainer.sandbox.conftest import TOKEN


def call(url: str, path: str, body: dict | None = None, token: str | None = TOKEN) -> tuple[int, dict]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(url + path, data=None if body is None else json.dumps(body).encode(),
                                     headers=headers, method="GET" if body is None else "POST")
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_runs_a_program_with_the_token(sandbox_service):
    url, _ = sandbox_service
    status, answer = call(url, "/v1/run", {"code": "print(6 * 7)"})
    assert status == 200
    assert answer == {"stdout": "42\n", "stderr": "", "exit_code": 0, "timed_out": False, "truncated": False,
                      "memory_exceeded": False, "scratch_exceeded": False}


@pytest.mark.parametrize("token", [None, "wrong-token", TOKEN[:-1]])
def test_refuses_a_missing_or_wrong_token(sandbox_service, token):
    url, _ = sandbox_service
    for path, body in (("/v1/run", {"code": "print('ran')"}), ("/v1/limits", None)):
        status, answer = call(url, path, body, token=token)
        assert (status, answer) == (401, {"error": "missing or wrong bearer token"})


def test_health_needs_no_token(sandbox_service):
    url, _ = sandbox_service
    assert call(url, "/healthz", token=None) == (200, {"status": "ok"})


@pytest.mark.parametrize(("body", "message"), [
    ({"code": "print(1)", "limits": {"wall_seconds": 600}}, "limits.wall_seconds is 600.0, this service allows at "
                                                           "most 20.0"),
    ({"code": "print(1)", "limits": {"memory_limit": 1}}, "memory_limit"),
    ({"code": "print(1)", "env": {"A": "1"}}, "unknown request keys: env"),
    ({"source": "print(1)"}, 'request body must be {"code"'),
])
def test_refuses_bad_requests_naming_the_field(sandbox_service, body, message):
    url, _ = sandbox_service
    status, answer = call(url, "/v1/run", body)
    assert status == 400 and message in answer["error"]


def test_does_not_start_without_a_token():
    environment = {"PATH": "/usr/bin:/bin", "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-m", "trainer.sandbox.server", "--port", "0"], env=environment,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "no token: pass --token-file or set ALIGNFLOW_SANDBOX_TOKEN" in done.stderr
