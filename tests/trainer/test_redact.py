"""Tests for `trainer.redact`: URIs lose their credentials, known secret values never reach a log line."""

from __future__ import annotations

import logging

import pytest

from trainer.redact import SecretRedactingFilter, redact_params, redact_text, redact_uri, secret_values


@pytest.mark.parametrize(("uri", "expected"), [
    ("http://alice:s3cret@mlflow:5000", "http://mlflow:5000"),
    ("https://token@host/path#frag", "https://host/path#frag"),
    ("http://user:p@ss@host/", "http://host/"),  # an unencoded "@" in the password
    ("postgresql://mlflow:pw@db:5432/mlflow", "postgresql://db:5432/mlflow"),
    ("https://s3/b/k?X-Amz-Credential=AKIA1&X-Amz-Signature=abc&partNumber=2",
     "https://s3/b/k?X-Amz-Credential=***&X-Amz-Signature=***&partNumber=2"),
    ("https://host/api?access_token=abc&sig=def&page=1&key=k", "https://host/api?access_token=***&sig=***&page=1&key=***"),
    ("http://mlflow:5000", "http://mlflow:5000"),
    ("sqlite:///mlflow.db", "sqlite:///mlflow.db"),
    ("s3://bucket/prefix/run", "s3://bucket/prefix/run"),
    ("/data/prompts.jsonl", "/data/prompts.jsonl"),
    ("databricks", "databricks"),
])
def test_redact_uri_drops_user_info_and_masks_token_like_query_values(uri, expected):
    assert redact_uri(uri) == expected


def test_redact_text_handles_every_uri_inside_a_message():
    message = ("API request to http://alice:s3cret@127.0.0.1:5000/api/2.0/mlflow/runs/create failed; "
               "retry 'https://bob:pw@other/x?token=t0k&n=1'")
    assert redact_text(message) == ("API request to http://127.0.0.1:5000/api/2.0/mlflow/runs/create failed; "
                                    "retry 'https://other/x?token=***&n=1'")


def test_redact_params_drops_secret_keys_and_redacts_nested_strings():
    params = {"model": {"path": "https://u:p@hub/m", "api_key": "k"}, "stop": ["http://a:b@c"], "lr": 0.1,
              "tracking": {"password": "pw", "run_name": "sft"}}
    assert redact_params(params) == {"model": {"path": "https://hub/m"}, "stop": ["http://c"], "lr": 0.1,
                                     "tracking": {"run_name": "sft"}}


def test_secret_values_are_the_known_variables_long_enough_to_mask():
    environ = {"AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI", "MLFLOW_TRACKING_TOKEN": "abc", "HOME": "/root",
               "MLFLOW_TRACKING_PASSWORD": "hunter22"}
    assert sorted(secret_values(environ)) == ["hunter22", "wJalrXUtnFEMI"]


def test_log_filter_masks_secrets_in_messages_arguments_and_tracebacks(caplog):
    logger = logging.getLogger("tests.redact")
    redaction = SecretRedactingFilter(["hunter22"])
    caplog.handler.addFilter(redaction)
    try:
        with caplog.at_level(logging.INFO, logger="tests.redact"):
            logger.info("connecting to %s with %s", "http://alice:hunter22@h:1", "hunter22")
            try:
                raise RuntimeError("login failed for password hunter22")
            except RuntimeError:
                logger.exception("tracking failed")
    finally:
        caplog.handler.removeFilter(redaction)
    assert "hunter22" not in caplog.text and "alice" not in caplog.text
    assert "connecting to http://h:1 with ***" in caplog.text
    assert "login failed for password ***" in caplog.text


def test_short_values_are_not_treated_as_secrets():
    # A test server's key "test" must not turn every "pytest" path in the logs into "py***".
    environ = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"}
    assert secret_values(environ) == ("wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",)
