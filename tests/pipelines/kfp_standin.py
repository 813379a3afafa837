"""A stand-in for the Kubeflow Pipelines v2beta1 REST API, on loopback, recording what clients send.

It answers the calls `kfp.Client` makes for submit, schedule and upload: experiments (list and
create), runs (create, then get, walking through scripted states), recurring runs (create) and
pipelines (list, upload, upload a version).
"""

from __future__ import annotations

import json
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class KfpStandIn:
    def __init__(self, run_states: tuple[str, ...] = ("RUNNING", "SUCCEEDED"), pipelines: dict | None = None) -> None:
        self.run_states = list(run_states)
        self.pipelines = dict(pipelines or {})  # display name -> pipeline id
        self.experiments: dict[str, str] = {}
        self.requests: list[dict] = []
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def host(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> KfpStandIn:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def sent(self, method: str, path: str) -> list[dict]:
        return [r for r in self.requests if r["method"] == method and r["path"] == path]

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        standin = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _reply(self, body: dict, code: int = 200) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _record(self, method: str) -> dict:
                url = urllib.parse.urlparse(self.path)
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:
                    body = raw  # a multipart upload
                request = {"method": method, "path": url.path, "query": urllib.parse.parse_qs(url.query), "body": body}
                standin.requests.append(request)
                return request

            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                request = self._record("GET")
                path = request["path"]
                if path == "/apis/v2beta1/healthz":
                    return self._reply({"multi_user": False})
                if path == "/apis/v2beta1/experiments":
                    wanted = json.dumps(request["query"].get("filter", [""])[0])
                    found = [{"experiment_id": i, "display_name": n} for n, i in standin.experiments.items()
                             if f'\\"{n}\\"' in wanted]
                    return self._reply({"experiments": found, "total_size": len(found)})
                if path.startswith("/apis/v2beta1/runs/"):
                    state = standin.run_states.pop(0) if len(standin.run_states) > 1 else standin.run_states[0]
                    return self._reply({"run_id": path.rsplit("/", 1)[-1], "state": state})
                if path == "/apis/v2beta1/pipelines":
                    wanted = json.dumps(request["query"].get("filter", [""])[0])
                    found = [{"pipeline_id": i, "display_name": n} for n, i in standin.pipelines.items()
                             if f'\\"{n}\\"' in wanted]
                    return self._reply({"pipelines": found, "total_size": len(found)})
                self._reply({"error": "not found", "code": 5}, 404)

            def do_POST(self) -> None:  # noqa: N802
                request = self._record("POST")
                path, body = request["path"], request["body"]
                if path == "/apis/v2beta1/experiments":
                    experiment_id = f"exp-{len(standin.experiments) + 1}"
                    standin.experiments[body["display_name"]] = experiment_id
                    return self._reply({"experiment_id": experiment_id, "display_name": body["display_name"]})
                if path == "/apis/v2beta1/runs":
                    return self._reply({"run_id": "run-1", "display_name": body["display_name"], "state": "PENDING"})
                if path == "/apis/v2beta1/recurringruns":
                    return self._reply({"recurring_run_id": "rr-1", "display_name": body["display_name"]})
                if path == "/apis/v2beta1/pipelines/upload":
                    name = request["query"].get("name", ["?"])[0]
                    standin.pipelines[name] = "p-1"
                    return self._reply({"pipeline_id": "p-1", "display_name": name})
                if path == "/apis/v2beta1/pipelines/upload_version":
                    return self._reply({"pipeline_id": request["query"]["pipelineid"][0], "pipeline_version_id": "v-2"})
                self._reply({"error": "not found", "code": 5}, 404)

        return Handler
