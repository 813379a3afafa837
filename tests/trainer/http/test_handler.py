"""The JSON server base over real HTTP on loopback: the token check, the body's size and form, JSON errors."""

from __future__ import annotations

import http.client
import json

import pytest

from tests.trainer.http.scripted import ScriptedService

TOKEN = "server-token-for-tests-0123456789"


def post(url: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict, dict]:
    """(status, JSON answer, headers) of one raw POST, so that a test can send what no client would."""
    host, port = url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        connection.request("POST", "/v1", body=body, headers=headers)
        response = connection.getresponse()
        return response.status, json.loads(response.read()), dict(response.headers)
    finally:
        connection.close()


@pytest.fixture
def service():
    with ScriptedService(lambda call, path, body: (200, {"echo": body}), token=TOKEN) as running:
        yield running


@pytest.mark.parametrize("authorization", [None, "Bearer wrong", f"Basic {TOKEN}", f"Bearer {TOKEN[:-1]}"])
def test_a_missing_or_wrong_token_is_refused_with_401(service, authorization):
    headers = {"Content-Type": "application/json"} | ({"Authorization": authorization} if authorization else {})
    status, answer, answer_headers = post(service.url, b"{}", headers)
    assert (status, answer) == (401, {"error": "missing or wrong bearer token"})
    assert answer_headers["WWW-Authenticate"] == "Bearer" and answer_headers["Connection"] == "close"
    assert service.seen == []  # refused before the handler's route ran


def test_the_token_is_taken_whatever_the_schemes_case(service):
    assert post(service.url, b'{"a": 1}', {"Authorization": f"bearer {TOKEN}"})[:2] == (200, {"echo": {"a": 1}})


@pytest.mark.parametrize(("body", "headers", "status", "error"), [
    (b"{not json", {}, 400, "request body is not JSON"),
    (b"[1, 2]", {}, 400, "request body must be a JSON object"),
    (b"{}", {"Content-Length": "lots"}, 400, "Content-Length is 'lots', expected a byte count"),
    (b"{}", {"Content-Length": str(5 << 20)}, 413, f"request of {5 << 20} bytes, at most {4 << 20}"),
])
def test_a_body_that_is_not_a_json_object_within_the_limit_is_one_clear_error(service, body, headers, status, error):
    answer = post(service.url, body, {"Authorization": f"Bearer {TOKEN}", **headers})
    assert answer[0] == status and answer[1]["error"].startswith(error) and service.seen == []


def test_a_server_without_a_token_checks_none():
    with ScriptedService(lambda call, path, body: (200, {"echo": body})) as open_service:
        assert post(open_service.url, b"{}", {})[:2] == (200, {"echo": {}})
