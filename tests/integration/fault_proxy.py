"""A loopback TCP proxy that can cut a service off, for outage tests (S3 through moto, MLflow).

`FaultProxy(port)` forwards `127.0.0.1:<proxy.port>` to `127.0.0.1:<port>` byte for byte. During
`outage(seconds)` (or between `cut()` and `restore()`) it closes every open connection and resets
each new one at once, which is what a client sees when a load balancer or the service goes away:
`ConnectionResetError`/`EndpointConnectionError` from botocore, not a slow answer.
"""

from __future__ import annotations

import contextlib
import select
import socket
import struct
import threading
import time


class FaultProxy:
    """Forwards a loopback port to `target_port`; `cut`/`restore`/`outage` simulate the service going away.

    Args:
        target_port: The real service's port on 127.0.0.1.
    """

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._down = threading.Event()
        self._closing = threading.Event()
        self._connections: set[socket.socket] = set()
        self._lock = threading.Lock()
        self.refused = 0
        threading.Thread(target=self._accept, name="fault-proxy", daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def cut(self) -> None:
        """From now on reset new connections and close the open ones."""
        self._down.set()
        with self._lock:
            for connection in list(self._connections):
                _abort(connection)
            self._connections.clear()

    def restore(self) -> None:
        self._down.clear()

    def outage(self, seconds: float) -> threading.Thread:
        """Cut the service now and restore it after `seconds`, in the background; returns that thread."""
        self.cut()

        def restore_later() -> None:
            time.sleep(seconds)
            self.restore()

        thread = threading.Thread(target=restore_later, daemon=True)
        thread.start()
        return thread

    def close(self) -> None:
        self._closing.set()
        self.cut()
        self._listener.close()

    def _accept(self) -> None:
        while not self._closing.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self._down.is_set():
                self.refused += 1
                _abort(client)
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
            except OSError:
                _abort(client)
                continue
            with self._lock:
                self._connections.update((client, upstream))
            threading.Thread(target=self._pipe, args=(client, upstream), daemon=True).start()

    def _pipe(self, client: socket.socket, upstream: socket.socket) -> None:
        """Copy bytes both ways; an end-of-stream is passed on as a half-close, so replies still arrive."""
        open_ends = {client: upstream, upstream: client}
        try:
            while open_ends and not self._down.is_set():
                readable, _, _ = select.select(list(open_ends), [], [], 0.2)
                for source in readable:
                    data = source.recv(65536)
                    if data:
                        open_ends[source].sendall(data)
                    else:
                        with contextlib.suppress(OSError):
                            open_ends[source].shutdown(socket.SHUT_WR)
                        del open_ends[source]
        except OSError:
            pass
        finally:
            with self._lock:
                self._connections.discard(client)
                self._connections.discard(upstream)
            for sock in (client, upstream):
                if self._down.is_set():
                    _abort(sock)
                else:
                    with contextlib.suppress(OSError):
                        sock.close()


def _abort(sock: socket.socket) -> None:
    """Close with a reset (SO_LINGER 0), as a vanished peer would."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.close()
