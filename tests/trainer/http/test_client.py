"""The JSON client against real servers on loopback: what is retried, how long it waits, what a message says, and that
the token goes only where it should."""

from __future__ import annotations

import logging
import socket
import time

import pytest

from tests.trainer.http.scripted import ScriptedService
from trainer.http.client import BearerToken, JsonClient
from trainer.http.errors import ServiceCallError, ServiceError, ServiceUnavailableError
from trainer.http.retry import RetryPolicy
from trainer.http.transient import is_transient, is_unprocessed

TOKEN = "tok-for-the-http-layer-0123456789"
FAST = {"base_seconds": 0.01, "max_seconds": 0.05}


def free_port() -> int:
    """A loopback port nothing listens on (connections to it are refused)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def once_then_ok(status: int, headers: dict[str, str] | None = None):
    """A script answering `status` to the first request and 200 `{"ok": true}` to the others."""
    return lambda call, path, body: (status, {"error": "busy"}, headers or {}) if call == 1 else (200, {"ok": True})


@pytest.mark.parametrize("status", [408, 429, 500, 502, 503, 504])
def test_a_transient_status_is_retried_until_the_service_answers(status):
    with ScriptedService(once_then_ok(status)) as service:
        answer = JsonClient("scripted").request("POST", service.url + "/v1", {"a": 1}, retry=RetryPolicy(2, **FAST))
    assert answer == {"ok": True} and len(service.seen) == 2 and service.seen[1].body == {"a": 1}


@pytest.mark.parametrize("status", [400, 401, 403, 404, 409, 422])
def test_a_refusal_is_raised_at_once_naming_the_service_the_url_and_the_status(status):
    with ScriptedService(lambda call, path, body: (status, {"error": "not like that"})) as service:
        with pytest.raises(ServiceCallError) as raised:
            JsonClient("scripted").request("POST", service.url + "/v1", {}, retry=RetryPolicy(3, **FAST))
    assert len(service.seen) == 1 and raised.value.status == status and not is_transient(raised.value)
    assert str(raised.value).startswith(f"scripted ({service.url}/v1) answered HTTP {status} ")
    assert str(raised.value).endswith(": not like that")


def test_retry_after_is_honoured_within_the_policys_cap():
    with ScriptedService(once_then_ok(503, {"Retry-After": "0.6"})) as service:
        JsonClient("scripted").request("GET", service.url, retry=RetryPolicy(2, 0.01, 5.0))
    assert service.seen[1].at - service.seen[0].at >= 0.6  # not the 0.01 s backoff
    with ScriptedService(once_then_ok(503, {"Retry-After": "3600"})) as service:
        JsonClient("scripted").request("GET", service.url, retry=RetryPolicy(2, 0.01, 0.2))
    assert service.seen[1].at - service.seen[0].at < 2  # capped at max_seconds, not an hour


def test_the_deadline_ends_the_retries_before_the_budget():
    deadline = time.monotonic() + 0.5
    started = time.monotonic()
    with ScriptedService(lambda call, path, body: (503, {"error": "down"})) as service:
        with pytest.raises(ServiceUnavailableError, match=r"^GET http://127.0.0.1:\d+/: scripted kept failing "
                                                          r"\(HTTP 503 Service Unavailable: down\) until the deadline$"):
            JsonClient("scripted").request("GET", service.url + "/",
                                           retry=RetryPolicy(100, 0.1, 0.1, deadline=deadline, api="scripted"))
    assert time.monotonic() - started < 1.5 and 2 <= len(service.seen) <= 6


def test_no_answer_is_status_0_transient_and_named():
    url = f"http://127.0.0.1:{free_port()}/v1/run"
    with pytest.raises(ServiceCallError) as raised:
        JsonClient("scripted").send("POST", url, {})
    assert raised.value.status == 0 and is_transient(raised.value) and is_unprocessed(raised.value)
    assert str(raised.value).startswith(f"scripted ({url}) is unreachable or broke off: ConnectionRefusedError")


def test_a_request_that_must_not_run_twice_is_sent_again_only_when_it_was_not_processed():
    not_processed = RetryPolicy(2, **FAST, retry_if=is_unprocessed)
    with ScriptedService(once_then_ok(503)) as service:
        assert JsonClient("scripted").request("POST", service.url, {}, retry=not_processed) == {"ok": True}
    with ScriptedService(once_then_ok(500)) as service:  # a 500 may come after the work was done
        with pytest.raises(ServiceCallError, match="HTTP 500"):
            JsonClient("scripted").request("POST", service.url, {}, retry=RetryPolicy(2, **FAST, retry_if=is_unprocessed))
    assert len(service.seen) == 1


def test_an_answer_that_is_not_json_is_an_error_that_is_not_retried():
    with ScriptedService(lambda call, path, body: (200, b"<html>")) as service:
        client = JsonClient("scripted")
        client.send("POST", service.url, {}, expect_answer=False)  # a caller that does not read the answer
        with pytest.raises(ServiceError, match="answered something that is not JSON") as raised:
            client.request("POST", service.url, {}, retry=RetryPolicy(3, **FAST))
    assert not is_transient(raised.value) and len(service.seen) == 2


def test_the_token_is_sent_and_never_shown_even_when_a_service_quotes_it(caplog):
    def quoting(call, path, body):
        return (503 if call == 1 else 401), {"error": f"you sent Bearer {TOKEN}"}

    client = JsonClient("scripted", token=BearerToken(TOKEN))
    with ScriptedService(quoting) as service, caplog.at_level(logging.DEBUG):
        with pytest.raises(ServiceCallError) as raised:
            client.request("POST", service.url, {}, retry=RetryPolicy(2, **FAST))
    assert [seen.authorization for seen in service.seen] == [f"Bearer {TOKEN}"] * 2
    assert "you sent Bearer ***" in str(raised.value) and "HTTP 503" in caplog.text  # the retry was logged
    assert TOKEN not in str(raised.value) + caplog.text + repr(client) + repr(BearerToken(TOKEN))


def test_a_token_file_is_read_again_for_every_request(tmp_path):
    token_file = tmp_path / "token"
    client = JsonClient("scripted", token=BearerToken(path=token_file))
    with ScriptedService(lambda call, path, body: (200, {})) as service:
        for token in ("first-projected-token", "rotated-projected-token"):
            token_file.write_text(token + "\n")  # the kubelet rotates a projected token in place
            client.send("POST", service.url, {})
        token_file.unlink()
        with pytest.raises(ServiceError, match="cannot read the token file"):
            client.send("POST", service.url, {})
    assert [seen.authorization for seen in service.seen] == ["Bearer first-projected-token",
                                                            "Bearer rotated-projected-token"]


def test_the_status_of_a_url_is_whatever_it_answers_without_the_token():
    with ScriptedService(lambda call, path, body: (404, {"error": "no route"})) as service:
        assert JsonClient("scripted", token=BearerToken(TOKEN)).status_of(service.url + "/score") == 404
    assert service.seen[0].authorization is None
