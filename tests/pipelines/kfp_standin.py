"""A stand-in for the Kubeflow Pipelines v2beta1 REST API, on loopback, recording what clients send.

It answers the calls `kfp.Client` makes for submit, schedule and upload: experiments (list and
create), runs (create, then get, walking through scripted states), recurring runs (list, create,
delete) and pipelines (list, upload, upload a version). A scripted run state that is an integer is
answered as that HTTP error instead (a flaky API). Every request is recorded with its headers.

`before_plugins=True` plays an API server older than KFP 2.17: a run or recurring run carrying
`plugins_input` is refused with HTTP 400 naming the field, as those servers' JSON decoding refuses any unknown
field (kubeflow/pipelines `backend/src/apiserver/common/utils.go`, `CustomMarshaler`).
"""

from __future__ import annotations

import json
import threading
import urllib.parse
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class KfpStandIn:
    def __init__(self, run_states: tuple[str | int, ...] = ("RUNNING", "SUCCEEDED"), pipelines: dict | None = None,
                 multi_user: bool = False, on_get_run: Callable[[int], None] | None = None,
                 before_plugins: bool = False) -> None:
        self.run_states = list(run_states)
        self.pipelines = dict(pipelines or {})  # display name -> pipeline id
        self.experiments: dict[str, str] = {}  # name (or namespace/name) -> experiment id
        self.recurring_runs: dict[str, dict] = {}  # id -> {"display_name", "experiment_id"}
        self.multi_user = multi_user
        self.on_get_run = on_get_run
        self.before_plugins = before_plugins
        self.run_gets = 0
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

    def _next_run_state(self) -> str | int:
        self.run_gets += 1
        if self.on_get_run is not None:
            self.on_get_run(self.run_gets)
        return self.run_states.pop(0) if len(self.run_states) > 1 else self.run_states[0]

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        standin = self

        def wanted_name(request: dict) -> str:
            return json.dumps(request["query"].get("filter", [""])[0])

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
                request = {"method": method, "path": url.path, "query": urllib.parse.parse_qs(url.query),
                           "body": body, "authorization": self.headers.get("Authorization")}
                standin.requests.append(request)
                return request

            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                request = self._record("GET")
                path = request["path"]
                if path == "/apis/v2beta1/healthz":
                    return self._reply({"multi_user": standin.multi_user})
                if path == "/apis/v2beta1/experiments":
                    namespace = request["query"].get("namespace", [""])[0]
                    found = [{"experiment_id": i, "display_name": n.rpartition("/")[2]}
                             for n, i in standin.experiments.items()
                             if n.rpartition("/")[0] == namespace and f'\\"{n.rpartition("/")[2]}\\"' in wanted_name(request)]
                    return self._reply({"experiments": found, "total_size": len(found)})
                if path.startswith("/apis/v2beta1/runs/"):
                    state = standin._next_run_state()
                    if isinstance(state, int):
                        return self._reply({"error": "scripted failure", "code": 14}, state)
                    return self._reply({"run_id": path.rsplit("/", 1)[-1], "state": state})
                if path == "/apis/v2beta1/recurringruns":
                    experiment = request["query"].get("experiment_id", [None])[0]
                    found = [{"recurring_run_id": i, **r} for i, r in standin.recurring_runs.items()
                             if f'\\"{r["display_name"]}\\"' in wanted_name(request)
                             and experiment in (None, r["experiment_id"])]
                    return self._reply({"recurringRuns": found, "total_size": len(found)})
                if path == "/apis/v2beta1/pipelines":
                    found = [{"pipeline_id": i, "display_name": n} for n, i in standin.pipelines.items()
                             if f'\\"{n}\\"' in wanted_name(request)]
                    return self._reply({"pipelines": found, "total_size": len(found)})
                self._reply({"error": "not found", "code": 5}, 404)

            def do_POST(self) -> None:  # noqa: N802
                request = self._record("POST")
                path, body = request["path"], request["body"]
                if standin.before_plugins and isinstance(body, dict) and "plugins_input" in body:
                    message = 'proto: (line 1:2): unknown field "plugins_input"'
                    return self._reply({"error": message, "code": 3, "message": message}, 400)
                if path == "/apis/v2beta1/experiments":
                    experiment_id = f"exp-{len(standin.experiments) + 1}"
                    key = f"{body['namespace']}/{body['display_name']}" if body.get("namespace") else body["display_name"]
                    standin.experiments[key] = experiment_id
                    return self._reply({"experiment_id": experiment_id, "display_name": body["display_name"]})
                if path == "/apis/v2beta1/runs":
                    return self._reply({"run_id": "run-1", "display_name": body["display_name"], "state": "PENDING"})
                if path == "/apis/v2beta1/recurringruns":
                    recurring_id = f"rr-{len(standin.requests)}"
                    standin.recurring_runs[recurring_id] = {"display_name": body["display_name"],
                                                            "experiment_id": body.get("experiment_id")}
                    return self._reply({"recurring_run_id": recurring_id, "display_name": body["display_name"]})
                if path == "/apis/v2beta1/pipelines/upload":
                    name = request["query"].get("name", ["?"])[0]
                    standin.pipelines[name] = "p-1"
                    return self._reply({"pipeline_id": "p-1", "display_name": name})
                if path == "/apis/v2beta1/pipelines/upload_version":
                    return self._reply({"pipeline_id": request["query"]["pipelineid"][0], "pipeline_version_id": "v-2"})
                self._reply({"error": "not found", "code": 5}, 404)

            def do_DELETE(self) -> None:  # noqa: N802
                request = self._record("DELETE")
                if request["path"].startswith("/apis/v2beta1/recurringruns/"):
                    standin.recurring_runs.pop(request["path"].rsplit("/", 1)[-1], None)
                    return self._reply({})
                self._reply({"error": "not found", "code": 5}, 404)

        return Handler
