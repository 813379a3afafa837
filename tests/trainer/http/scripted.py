"""A scripted JSON service on loopback, built on `trainer.http.handler`: each request's answer comes from a script.

`ScriptedService(script, token=...)` answers request n (from 1) with `script(n, path, body)`: a
`(status, payload)` or `(status, payload, headers)` tuple; a payload of bytes is sent as it is (an
answer that is not JSON). It records each request's arrival time, path, Authorization header and body.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

from trainer.http.handler import JsonHandler, JsonServer

Answer = tuple[int, Any] | tuple[int, Any, dict[str, str]]


@dataclass
class Seen:
    """One request the service received."""

    at: float
    path: str
    authorization: str | None
    body: Any = field(default=None)


class ScriptedService:
    """A JsonServer on 127.0.0.1 whose answers `script(call_number, path, body)` decides."""

    def __init__(self, script: Callable[[int, str, Any], Answer], *, token: str | None = None) -> None:
        self.seen: list[Seen] = []
        lock = threading.Lock()
        service = self

        class Handler(JsonHandler):
            def do_GET(self) -> None:  # noqa: N802
                self.answer(None)

            def do_POST(self) -> None:  # noqa: N802
                if not self.is_authorized():
                    return
                body = self.read_json_object()
                if body is not None:
                    self.answer(body)

            def answer(self, body: Any) -> None:
                with lock:
                    service.seen.append(Seen(time.monotonic(), self.path, self.headers.get("Authorization"), body))
                    call = len(service.seen)
                status, payload, *headers = script(call, self.path, body)
                if not isinstance(payload, bytes):
                    self.reply(HTTPStatus(status), payload, headers[0] if headers else None)
                    return
                self.send_response(status)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self.server = JsonServer(("127.0.0.1", 0), Handler, token=token)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def __enter__(self) -> ScriptedService:
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
