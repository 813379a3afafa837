"""Keeping credentials out of what a run prints and writes.

Secrets reach a run only through the environment (a Kubernetes Secret): S3 keys, MLflow's
username/password/token, and sometimes a URI with user info (`MLFLOW_TRACKING_URI=https://user:pass@host`).
Anything that shows a URI (log lines, `mlflow_run.json`, MLflow params, reports) passes it through
`redact_uri`, which drops the user info (so the result still works as a link) and masks token-like
query parameters; free text that may embed URIs (an exception from an HTTP client) goes through
`redact_text`, and logged params through `redact_params`.
`SecretRedactingFilter` is the last line of defence: installed on the log handlers, it also masks
the exact values of the known secret variables wherever a library happens to print them.

What this cannot do: find a secret that is neither in a URI nor in a known variable.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

from trainer.secret_keys import MLFLOW_SECRET_KEYS, S3_SECRET_KEYS, SANDBOX_TOKEN_VARIABLE

MASK = "***"
# Variables whose values are credentials: never printed, whatever prints them.
SECRET_ENV_VARS = (*S3_SECRET_KEYS, "AWS_SESSION_TOKEN", *MLFLOW_SECRET_KEYS, "DATABRICKS_TOKEN", "KFP_TOKEN",
                   "HF_TOKEN", "AZURE_STORAGE_KEY", "AZURE_STORAGE_CONNECTION_STRING", SANDBOX_TOKEN_VARIABLE)
# Keys of params/config entries that are never logged.
SECRET_KEY = re.compile(r"secret|password|token|credential|access_key|api_key", re.IGNORECASE)
# Shorter values are not real credentials (AWS key ids are 20 characters, secret keys 40) and masking
# them would mangle ordinary words: a test S3 server's key "test" would mask every "pytest" path.
MIN_SECRET_LENGTH = 8
_SECRET_PARAM = re.compile(r"token|secret|passw|pwd|signature|^sig$|credential|api[-_]?key|^key$|^auth|session",
                           re.IGNORECASE)
# scheme://userinfo@ : the user info runs to the last "@" before the path.
_USERINFO = re.compile(r"\b([A-Za-z][A-Za-z0-9+.-]*://)[^/\s?#'\"<>]*@")
_QUERY_PARAM = re.compile(r"([?&;])([^=&;#\s'\"<>]+)=([^&;#\s'\"<>]*)")


def redact_uri(uri: str) -> str:
    """`uri` without user info (`https://user:pass@host` -> `https://host`) or token-like query values.

    Anything that is not a URI with an authority or a query comes back unchanged.
    """
    try:
        parts = urlsplit(uri)
    except ValueError:
        return redact_text(uri)
    if not parts.scheme or not (parts.netloc or parts.query):
        return uri
    netloc = parts.netloc.rpartition("@")[2]
    query = "&".join(_redact_param(item) for item in parts.query.split("&")) if parts.query else ""
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def _redact_param(item: str) -> str:
    key, sep, value = item.partition("=")
    return f"{key}={MASK}" if sep and value and _SECRET_PARAM.search(unquote(key)) else item


def redact_text(text: str) -> str:
    """`text` without the user info, and with token-like query values masked, of every URI in it."""
    text = _USERINFO.sub(lambda m: m.group(1), text)
    return _QUERY_PARAM.sub(lambda m: f"{m.group(1)}{m.group(2)}={MASK}" if m.group(3) and
                            _SECRET_PARAM.search(unquote(m.group(2))) else m.group(0), text)


def mask_secrets(text: str, secrets: Iterable[str]) -> str:
    """`text` with every occurrence of each of `secrets` replaced by the mask (longest first, empty ones skipped)."""
    for secret in sorted(filter(None, secrets), key=len, reverse=True):
        text = text.replace(secret, MASK)
    return text


def redact_params(values: Mapping[str, Any]) -> dict[str, Any]:
    """Params (a config as a nested dict) without secret-looking keys and with every string redacted."""
    return {key: _redact_value(value) for key, value in values.items() if not SECRET_KEY.search(str(key))}


def _redact_value(value: Any) -> Any:
    if isinstance(value, Mapping):
        return redact_params(value)
    if isinstance(value, (list, tuple)):
        return [_redact_value(item) for item in value]
    return redact_text(value) if isinstance(value, str) else value


def secret_values(environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The values of the known secret variables that are set (and long enough to mask safely)."""
    environ = os.environ if environ is None else environ
    return tuple(value for name in SECRET_ENV_VARS if len(value := environ.get(name, "")) >= MIN_SECRET_LENGTH)


class SecretRedactingFilter(logging.Filter):
    """Rewrites each record's message with URIs redacted and known secret values masked.

    Args:
        secrets: Exact strings to mask (default: `secret_values()` at construction).
    """

    def __init__(self, secrets: Iterable[str] | None = None) -> None:
        super().__init__()
        self.secrets = tuple(sorted(secret_values() if secrets is None else secrets, key=len, reverse=True))

    def redact(self, text: str) -> str:
        return mask_secrets(redact_text(text), self.secrets)

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except (TypeError, ValueError):  # a malformed call: the handler reports it, unredacted args are dropped
            record.msg, record.args = self.redact(str(record.msg)), None
            return True
        redacted = self.redact(message)
        if redacted != message:
            record.msg, record.args = redacted, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = self.redact(record.exc_text)
        return True


def install_log_redaction(logger: logging.Logger | None = None) -> SecretRedactingFilter:
    """Add a `SecretRedactingFilter` to every handler of `logger` (default: the root logger)."""
    redaction = SecretRedactingFilter()
    for handler in (logger or logging.getLogger()).handlers:
        handler.addFilter(redaction)
    return redaction
