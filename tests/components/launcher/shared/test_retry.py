"""The launcher's and the CLI's retries: the one definition of a transient failure (`trainer.http`) sorts the
Kubernetes client's and the KFP client's errors alike, and the launcher's policy names its API and error."""

from __future__ import annotations

import time

import pytest
import urllib3
from kfp_server_api.exceptions import ApiException as KfpApiException
from kubernetes.client.exceptions import ApiException as KubernetesApiException

from components.launcher.shared.retry import ApiUnavailable, RetryPolicy
from trainer.errors import PipelineError
from trainer.http.transient import is_transient


@pytest.mark.parametrize("client_error", [KubernetesApiException, KfpApiException])
def test_both_clients_answers_are_sorted_alike(client_error):
    assert all(is_transient(client_error(status=status)) for status in (0, 408, 429, 500, 502, 503, 504))
    assert not any(is_transient(client_error(status=status)) for status in (400, 401, 403, 404, 409, 422))


def test_a_failed_connection_is_transient_and_other_errors_are_not():
    assert is_transient(ConnectionResetError()) and is_transient(TimeoutError())
    assert is_transient(urllib3.exceptions.ProtocolError("connection aborted"))
    assert not is_transient(ValueError("bad")) and not is_transient(PipelineError("x"))


def test_retries_until_an_answer_and_gives_up_past_the_budget_with_the_policys_error():
    waits: list[float] = []
    answers = iter([KubernetesApiException(status=503), KubernetesApiException(status=429), "done"])

    def call():
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    assert RetryPolicy(max_retries=3, base_seconds=1.0, sleep=waits.append).call(call, "get job") == "done"
    assert waits == [1.0, 2.0]
    with pytest.raises(ApiUnavailable, match="list: the Kubernetes API kept failing \\(HTTP 503\\) after 1 retries"):
        RetryPolicy(max_retries=1, sleep=waits.append).call(
            lambda: (_ for _ in ()).throw(KubernetesApiException(status=503)), "list")


def test_a_wait_that_would_pass_the_deadline_is_not_made():
    waits: list[float] = []
    policy = RetryPolicy(base_seconds=10.0, sleep=waits.append, deadline=time.monotonic() + 5, api="the KFP API",
                         unavailable=PipelineError)

    def fail():
        raise KfpApiException(status=502)

    with pytest.raises(PipelineError, match="get_run r: the KFP API kept failing \\(HTTP 502"):
        policy.call(fail, "get_run r")
    assert waits == []
