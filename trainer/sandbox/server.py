"""The sandbox service: `python -m trainer.sandbox.server --port 8080 [--token-file PATH]`.

A small standard-library HTTP server that runs `run_python` on its own machine behind a bearer token,
for clusters whose trainer nodes cannot host the local sandbox (an old kernel, a profile without
Landlock) or that want untrusted code off the GPU nodes. The chart installs it as a Deployment
(`sandbox.enabled`). The protocol is `remote.py`'s, served through `trainer.http.handler` (the token check,
the body, the JSON answers); the token comes from `--token-file` (a mounted Secret) or the
`ALIGNFLOW_SANDBOX_TOKEN` variable and never appears in a log line. It checks the sandbox at
start-up and refuses to start when it cannot hold. Limits a request asks for above the service's own
(`--max-wall-seconds`, `--max-processes`, ... flags) are refused with 400. At most `--concurrency` programs run at once; other
requests wait their turn.
"""

from __future__ import annotations

import argparse
import logging
import os
import threading
import time
from http import HTTPStatus
from pathlib import Path

from pydantic import ValidationError

from trainer.http.handler import JsonHandler, JsonServer
from trainer.sandbox.contract import SandboxError, SandboxLimits
from trainer.sandbox.local import check_sandbox, run_python
from trainer.secret_keys import SANDBOX_TOKEN_VARIABLE

logger = logging.getLogger(__name__)
MAX_REQUEST_BYTES = 4 << 20


class SandboxService(JsonServer):
    """The HTTP server, holding the token, the ceiling limits and the concurrency bound."""

    def __init__(self, address: tuple[str, int], *, token: str, max_limits: SandboxLimits, concurrency: int,
                 interpreter: str | None = None):
        super().__init__(address, SandboxRequestHandler, token=token)
        self.max_limits, self.interpreter = max_limits, interpreter
        self.slots = threading.BoundedSemaphore(concurrency)


class SandboxRequestHandler(JsonHandler):
    """The routes; the token check, the body and the answers are `JsonHandler`'s."""

    server: SandboxService
    max_body_bytes = MAX_REQUEST_BYTES

    def do_GET(self) -> None:
        """`/healthz` for anyone; `/v1/limits` with the token."""
        if self.path == "/healthz":
            self.reply(HTTPStatus.OK, {"status": "ok"})
        elif self.is_authorized():
            if self.path == "/v1/limits":
                self.reply(HTTPStatus.OK, {"max_limits": self.server.max_limits.model_dump()})
            else:
                self.reply_error(HTTPStatus.NOT_FOUND, f"no such path {self.path}")

    def do_POST(self) -> None:
        """`/v1/run` with the token: run the program, answer its SandboxResult."""
        if not self.is_authorized():
            return
        if self.path != "/v1/run":
            self.refuse(HTTPStatus.NOT_FOUND, f"no such path {self.path}")
            return
        request = self.read_json_object()
        if request is None:
            return
        try:
            code, limits = self._parse(request)
        except ValueError as err:
            self.reply_error(HTTPStatus.BAD_REQUEST, str(err))
            return
        started = time.monotonic()
        with self.server.slots:
            try:
                result = run_python(code, limits=limits, interpreter=self.server.interpreter)
            except SandboxError as err:
                self.reply_error(HTTPStatus.SERVICE_UNAVAILABLE, str(err))
                return
        logger.info("ran %d bytes of code in %.2f s: exit %s, timed out %s, truncated %s", len(code),
                    time.monotonic() - started, result.exit_code, result.timed_out, result.truncated)
        self.reply(HTTPStatus.OK, result.to_dict())

    def _parse(self, request: dict) -> tuple[str, SandboxLimits]:
        """The request's code and limits; ValueError naming the field when they are not acceptable."""
        if not isinstance(request.get("code"), str):
            raise ValueError('request body must be {"code": "<python source>", "limits": {...}}')
        unknown = set(request) - {"code", "limits"}
        if unknown:
            raise ValueError(f"unknown request keys: {', '.join(sorted(unknown))}")
        try:
            limits = SandboxLimits(**(request.get("limits") or {}))
        except (ValidationError, TypeError) as err:
            raise ValueError(f"limits: {err}") from err
        allowed = self.server.max_limits.model_dump()
        for name, value in limits.model_dump().items():
            if value > allowed[name]:
                raise ValueError(f"limits.{name} is {value}, this service allows at most {allowed[name]}")
        return request["code"], limits


def read_token(token_file: str | None, environ: dict[str, str]) -> str:
    """The service's token from `token_file`, else the `ALIGNFLOW_SANDBOX_TOKEN` variable.

    Raises:
        SandboxError: Neither holds a token.
    """
    if token_file:
        token = Path(token_file).read_text().strip()
    else:
        token = environ.get(SANDBOX_TOKEN_VARIABLE, "").strip()
    if not token:
        raise SandboxError(f"sandbox service: no token: pass --token-file or set {SANDBOX_TOKEN_VARIABLE}")
    return token


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    """The server's command line (the chart's Deployment passes these flags)."""
    parser = argparse.ArgumentParser(prog="python -m trainer.sandbox.server", description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="0.0.0.0", help="address to listen on")
    parser.add_argument("--port", type=int, default=8080, help="port to listen on (0: any free port)")
    parser.add_argument("--token-file", help=f"file holding the bearer token (default: ${SANDBOX_TOKEN_VARIABLE})")
    parser.add_argument("--concurrency", type=int, default=4, help="programs that may run at once")
    parser.add_argument("--interpreter", help="Python that runs the programs (default: this one)")
    for name, field in SandboxLimits.model_fields.items():
        parser.add_argument(ceiling_flag(name), dest=f"ceiling_{name}", type=type(field.default),
                            default=field.default, help=f"most a request may ask for: {field.description}")
    return parser.parse_args(argv)


def ceiling_flag(name: str) -> str:
    """The flag setting the most a request may ask for of limit `name`: --max-wall-seconds, --max-processes."""
    return "--" + (name if name.startswith("max_") else f"max_{name}").replace("_", "-")


def main(argv: list[str] | None = None) -> None:
    """Check the sandbox, then serve until stopped; exit status 2 when it cannot start."""
    arguments = parse_arguments(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    max_limits = SandboxLimits(**{name: getattr(arguments, f"ceiling_{name}") for name in SandboxLimits.model_fields})
    try:
        token = read_token(arguments.token_file, dict(os.environ))
        check_sandbox(interpreter=arguments.interpreter)  # refuse to serve a sandbox that cannot hold here
    except SandboxError as err:
        logger.error("%s", err)
        raise SystemExit(2) from err
    server = SandboxService((arguments.host, arguments.port), token=token, max_limits=max_limits,
                            concurrency=arguments.concurrency, interpreter=arguments.interpreter)
    # The tests read the port from this line when they ask for port 0.
    logger.info("sandbox service listening on %s:%d", arguments.host, server.server_address[1])
    try:
        server.serve_forever()
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
