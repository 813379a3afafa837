"""What the JSON client raises. Each message names the service and the URL, and never holds the token.

`ServiceCallError` is one failed try and carries what `is_transient` reads (`status`, 0 when no HTTP
answer came; `reason`; `headers`, for Retry-After), so the retry policy can tell an outage from a
refusal. The callers turn these into their own domain's errors (RewardError, SandboxError).
"""

from __future__ import annotations

from collections.abc import Mapping

from trainer.errors import AlignflowError


class ServiceError(AlignflowError):
    """An HTTP service refused a request, answered something unusable, or could not be asked."""


class ServiceCallError(ServiceError):
    """One try that got an error status, or no HTTP answer at all (`status` 0).

    Attributes:
        url: Where the request went.
        status: The HTTP status; 0 when the connection failed or the answer was not HTTP.
        reason: The status's reason phrase and the service's own words (`Service Unavailable: busy`); with status 0,
            the exception under the connection (as urllib's URLError keeps it).
        headers: The answer's headers (`Retry-After`); empty with status 0.
    """

    def __init__(self, message: str, *, url: str, status: int, reason: str | BaseException,
                 headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.url = url
        self.status = status
        self.reason = reason
        self.headers = headers or {}


class ServiceUnavailableError(ServiceError):
    """An HTTP service kept failing transiently past the retry budget or the deadline."""
