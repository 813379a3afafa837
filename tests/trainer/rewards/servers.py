"""Real servers on loopback for the reward tests: the reference reward server, a scripted HTTP service, and a raw
TCP service that breaks the HTTP protocol on purpose."""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[3]


def write_reward_model(tiny_model: Path, directory: Path, seed: int = 3) -> torch.nn.Module:
    """An offline `LlamaForSequenceClassification` (one label) on the tiny config, saved with its tokenizer."""
    from transformers import AutoConfig, LlamaForSequenceClassification

    from trainer.tiny.model import build_tokenizer

    config = AutoConfig.from_pretrained(tiny_model)
    config.num_labels = 1
    config.pad_token_id = build_tokenizer().pad_token_id
    torch.manual_seed(seed)
    model = LlamaForSequenceClassification(config).eval()
    model.save_pretrained(directory)
    build_tokenizer().save_pretrained(directory)
    return model


class RewardServer:
    """`python -m trainer.rewards.server` in a subprocess; `url` once it prints its address."""

    def __init__(self, model_dir: Path, token: str | None = None, log: Path | None = None, port: int = 0) -> None:
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        command = [sys.executable, "-m", "trainer.rewards.server", "--model", str(model_dir), "--port", str(port)]
        if token is not None:
            env["TEST_REWARD_SERVER_TOKEN"] = token
            command += ["--token-env", "TEST_REWARD_SERVER_TOKEN"]
        self.log = open(log, "w") if log else subprocess.DEVNULL  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=self.log, text=True)
        line = self.process.stdout.readline()
        if "http://" not in line:
            self.process.kill()
            raise RuntimeError(f"the reward server did not start: {line!r}")
        self.url = line.split()[-1]

    def health(self) -> dict:
        import urllib.request

        with urllib.request.urlopen(self.url + "/health", timeout=10) as response:
            return json.loads(response.read())

    def kill(self) -> None:
        """SIGKILL, as a node failure or an OOM kill ends a pod: no goodbye to open connections."""
        self.process.kill()
        self.stop()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
        self.process.wait(timeout=30)
        if self.log is not subprocess.DEVNULL and not self.log.closed:
            self.log.close()


class ScriptedService:
    """A stdlib HTTP service whose answers a test scripts: `answer(body, call_number) -> (status, payload)`
    (or `respond`, which also sees the request headers).

    It records the bodies it received and the most requests it saw in flight at once.
    """

    def __init__(self, answer: Callable[[dict, int], tuple[int, object]] | None, delay: float = 0.0,
                 port: int = 0) -> None:
        self.respond = None if answer is None else lambda body, call, headers: answer(body, call)
        """`respond(body, call_number, headers) -> (status, payload)`; settable after the server starts."""
        self.bodies: list[dict] = []
        self.headers: list[dict] = []
        self.in_flight = self.max_in_flight = 0
        lock = threading.Lock()
        service = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with lock:
                    service.bodies.append(body)
                    service.headers.append(dict(self.headers))
                    call = len(service.bodies)
                    service.in_flight += 1
                    service.max_in_flight = max(service.max_in_flight, service.in_flight)
                time.sleep(delay)
                status, payload = service.respond(body, call, dict(self.headers))
                data = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
                with lock:
                    service.in_flight -= 1
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def free_port() -> int:
    """A loopback port nothing listens on (connections to it are refused)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def read_request(connection: socket.socket) -> bytes:
    """One HTTP request's bytes: the head, then as many body bytes as its Content-Length says."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = connection.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    while len(body) < length:
        chunk = connection.recv(65536)
        if not chunk:
            break
        body += chunk
    return data


class RawService:
    """A TCP service on loopback that answers connection number n (from 1) with `reply(n)`: the raw bytes to send
    before closing, `b""` to close without a word, `RESET` to reset the connection, or a float: seconds to stay
    silent before closing (a hung service)."""

    RESET = "reset"

    def __init__(self, reply: Callable[[int], bytes | str | float]) -> None:
        self.reply = reply
        self.connections = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.lock = threading.Lock()
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self) -> None:
        while True:
            try:
                connection, _ = self.listener.accept()
            except OSError:  # closed by stop()
                return
            with self.lock:
                self.connections += 1
                number = self.connections
            threading.Thread(target=self.answer, args=(connection, number), daemon=True).start()

    def answer(self, connection: socket.socket, number: int) -> None:
        with connection:
            read_request(connection)
            reply = self.reply(number)
            if reply == self.RESET:  # linger 0: close sends RST instead of FIN
                connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            elif isinstance(reply, float):
                time.sleep(reply)
            else:
                connection.sendall(reply)

    def stop(self) -> None:
        self.listener.close()


def json_reply(payload: object, status: str = "200 OK") -> bytes:
    """A well-formed HTTP/1.1 answer carrying `payload` as JSON."""
    data = json.dumps(payload).encode()
    return (f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n"
            f"Connection: close\r\n\r\n").encode() + data
