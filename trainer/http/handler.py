"""The base of alignflow's small JSON servers (the reference reward server, the sandbox service).

Standard library `http.server`, one thread per request. `JsonServer` holds the bearer token requests
must carry; `JsonHandler` checks it in constant time (401 with `WWW-Authenticate: Bearer` without it),
reads a JSON object body within `max_body_bytes` (400 or 413 otherwise), and answers JSON; an error
is `{"error": "<one line>"}`, the text `JsonClient` quotes in its messages. A handler that answers
before reading the body closes the connection, so a kept-alive one never reads that body as a request.
Request lines go to the debug log; headers, and so the token, never go anywhere.

What this leaves out: TLS (put the servers behind the cluster's mesh or ingress) and the routes,
which each server's handler writes in its `do_GET` and `do_POST`.
"""

from __future__ import annotations

import hmac
import json
import logging
from collections.abc import Mapping
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

logger = logging.getLogger(__name__)


class JsonServer(ThreadingHTTPServer):
    """A threading HTTP server whose requests must carry `token` as a bearer token (None: no check)."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: type[JsonHandler], *, token: str | None) -> None:
        super().__init__(address, handler)
        self.token = token


class JsonHandler(BaseHTTPRequestHandler):
    """The request handler base: token, JSON body, JSON answers (see the module docstring)."""

    server: JsonServer
    max_body_bytes = 4 << 20

    def is_authorized(self) -> bool:
        """Whether the request carries the server's token; answers 401 when it does not."""
        if self.server.token is None:
            return True
        scheme, _, presented = (self.headers.get("Authorization") or "").partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(presented.strip().encode(), self.server.token.encode()):
            return True
        self.refuse(HTTPStatus.UNAUTHORIZED, "missing or wrong bearer token", {"WWW-Authenticate": "Bearer"})
        return False

    def read_json_object(self) -> dict[str, Any] | None:
        """The request's body, a JSON object; None once 400 or 413 has been answered because it is not one."""
        length = self.headers.get("Content-Length") or "0"
        if not length.isdigit():
            self.refuse(HTTPStatus.BAD_REQUEST, f"Content-Length is {length!r}, expected a byte count")
            return None
        if int(length) > self.max_body_bytes:
            self.refuse(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"request of {length} bytes, at most {self.max_body_bytes}")
            return None
        try:
            body = json.loads(self.rfile.read(int(length)) or b"null")
        except ValueError as err:
            self.reply_error(HTTPStatus.BAD_REQUEST, f"request body is not JSON: {err}")
            return None
        if not isinstance(body, dict):
            self.reply_error(HTTPStatus.BAD_REQUEST, "request body must be a JSON object")
            return None
        return body

    def reply(self, status: HTTPStatus, payload: Any, headers: Mapping[str, str] | None = None) -> None:
        """Answer `payload` as JSON with `status`."""
        data = json.dumps(payload).encode()
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def reply_error(self, status: HTTPStatus, message: str, headers: Mapping[str, str] | None = None) -> None:
        """Answer `{"error": message}` with `status`."""
        self.reply(status, {"error": message}, headers)

    def refuse(self, status: HTTPStatus, message: str, headers: Mapping[str, str] | None = None) -> None:
        """`reply_error` before the body is read, closing the connection (the unread body must not be parsed as
        the next request)."""
        self.reply_error(status, message, {**(headers or {}), "Connection": "close"})

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (BaseHTTPRequestHandler's signature)
        logger.debug("%s %s", self.address_string(), format % args)  # the request line; headers never
