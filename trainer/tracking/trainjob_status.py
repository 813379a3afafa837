"""A job's progress in its TrainJob: `status.trainerStatus` (Kubeflow Trainer v2.2+, KEP-2779, gate `TrainJobStatus`).

Where the feature gate is on, Trainer's `TrainJobStatus` plugin gives every trainer container three variables:
`KUBEFLOW_TRAINER_SERVER_URL` (the controller's HTTPS endpoint for this TrainJob,
`.../apis/trainer.kubeflow.org/v1alpha1/namespaces/<ns>/trainjobs/<name>/status`),
`KUBEFLOW_TRAINER_SERVER_CA_CERT` (a file: the CA that signed the endpoint's certificate) and
`KUBEFLOW_TRAINER_SERVER_TOKEN` (a file: a projected service-account token whose audience names this TrainJob,
good for nothing else, refreshed by the kubelet). A status update is one POST of
`{"trainerStatus": {progressPercentage, estimatedRemainingSeconds, metrics: [{name, value}], lastUpdatedTime}}`
with the token as a bearer token; the controller verifies it against the cluster's service-account issuer
(signature, expiry, this TrainJob's audience) and that it was issued in the TrainJob's namespace (not which pod
sent it), and writes the status. This is the contract the Kubeflow SDK's `update_trainjob_status` speaks; the trainer image carries no SDK,
so it is spoken here with `trainer.http`'s JSON client (standard library only), one try per send: the next send
is the retry.

`TrainJobStatusReporter` is a `Tracker`: it reads the metrics the loops already log (`loss`,
`perf/tokens_per_second`, `episode/reward_mean`, and the loops' `progress/*` counters) and keeps only the latest.
A background thread sends them at most once per `min_interval_seconds` (only when something changed), so the
training loop never waits on the controller; `close` sends the last state once, within `CLOSE_SECONDS` (3 s) in
all, and not to an endpoint whose last send failed (so an absent one costs the exit, and a preempted pod's grace
period, at most that). A failed send is logged once and
otherwise ignored: progress is a courtesy, never a reason to stop training.

Without the variables (a PyTorchJob, an older Trainer, the gate off, a local run) no reporter is built.
"""

from __future__ import annotations

import datetime
import logging
import math
import ssl
import threading
import time
from pathlib import Path
from typing import Any

from trainer.http.client import BearerToken, JsonClient
from trainer.http.errors import ServiceError
from trainer.redact import redact_text
from trainer.runtime import TrainJobStatusEnv

logger = logging.getLogger(__name__)

MIN_INTERVAL_SECONDS = 10.0  # at most one update this often (the SDK's own floor is 5 s)
REQUEST_TIMEOUT_SECONDS = 5.0
# The most `close` waits, whatever the endpoint does: it runs on the way out, the preemption path's too, where
# the grace period is short. An endpoint that failed the last send is taken to be away and not asked again.
CLOSE_SECONDS = 3.0
MAX_FIELD_CHARS = 64  # the CRD's limit on a metric's name and value
# Metric keys the loops log -> the names shown in the TrainJob (KEP-2779's examples use camelCase).
REPORTED = {
    "loss": "loss", "episode/reward_mean": "reward", "perf/tokens_per_second": "tokensPerSecond",
    "perf/samples_per_second": "samplesPerSecond", "progress/epoch": "currentEpoch",
    "progress/total_epochs": "totalEpochs", "progress/episode": "currentEpisode",
    "progress/total_episodes": "totalEpisodes", "progress/total_steps": "totalSteps",
}


def format_value(value: float) -> str:
    """A metric value as the CRD takes it: a short string (integers without a decimal point)."""
    if float(value).is_integer() and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.6g}"


class ProgressState:
    """The latest progress, built from logged metrics; `trainer_status()` is the payload's `trainerStatus`."""

    def __init__(self, clock=time.monotonic) -> None:
        self.clock = clock
        self.values: dict[str, float] = {}
        self.step = 0
        self.first: tuple[int, float] | None = None  # (step, time) of the first report: the rate's origin
        self.version = 0  # bumped on every change, so the sender skips an unchanged state

    def update(self, metrics: dict[str, float], step: int) -> None:
        for key, value in metrics.items():
            if key in REPORTED and isinstance(value, (int, float)) and math.isfinite(value):
                self.values[key] = float(value)
        if self.first is None:
            self.first = (step, self.clock())
        self.step = max(self.step, step)
        self.version += 1

    def fraction_done(self) -> float | None:
        """Steps done over total steps; episodes done over total episodes (an online stage); None unknown."""
        total_steps = self.values.get("progress/total_steps")
        if total_steps:
            return min(1.0, self.step / total_steps)
        total_episodes = self.values.get("progress/total_episodes")
        if total_episodes and "progress/episode" in self.values:
            return min(1.0, (self.values["progress/episode"] - 1) / total_episodes)  # the current one is under way
        return None

    def remaining_seconds(self) -> int | None:
        """Seconds left at the rate since the first report (steps per second); None before a rate exists."""
        total_steps = self.values.get("progress/total_steps")
        if not total_steps or self.first is None or self.step <= self.first[0]:
            return None
        rate = (self.step - self.first[0]) / max(1e-9, self.clock() - self.first[1])
        return max(0, int((total_steps - self.step) / rate))

    def trainer_status(self) -> dict[str, Any]:
        status: dict[str, Any] = {"lastUpdatedTime": datetime.datetime.now(datetime.timezone.utc)
                                  .strftime("%Y-%m-%dT%H:%M:%SZ")}
        fraction = self.fraction_done()
        if fraction is not None:
            status["progressPercentage"] = int(fraction * 100)
        remaining = self.remaining_seconds()
        if remaining is not None:
            status["estimatedRemainingSeconds"] = min(remaining, 2**31 - 1)  # an int32 in the CRD
        metrics = [{"name": "currentStep", "value": str(self.step)}]
        metrics += [{"name": REPORTED[key], "value": format_value(value)[:MAX_FIELD_CHARS]}
                    for key, value in self.values.items()]
        status["metrics"] = metrics
        return status


class StatusEndpoint:
    """One TrainJob's status endpoint: POSTs a `trainerStatus` with the projected token (re-read for each send, as
    the kubelet rotates it) over TLS trusting the controller's CA."""

    def __init__(self, env: TrainJobStatusEnv) -> None:
        self.url = env.url
        self.client = JsonClient("the TrainJob status endpoint",
                                 token=BearerToken(path=env.token_path) if env.token_path else None,
                                 ssl_context=ssl.create_default_context(cafile=env.ca_cert_path or None))

    def send(self, trainer_status: dict[str, Any], timeout: float = REQUEST_TIMEOUT_SECONDS) -> None:
        """Raises ServiceError when the update is not accepted within `timeout` seconds (its answer is not parsed:
        the SDK ignores it too)."""
        self.client.send("POST", self.url, {"trainerStatus": trainer_status}, timeout=timeout, expect_answer=False)


class TrainJobStatusReporter:
    """A `Tracker` that shows the run's progress in its TrainJob; see the module docstring.

    Args:
        env: Where and how to report (the variables Trainer's `TrainJobStatus` plugin injects).
        min_interval_seconds: The least time between two updates.
    """

    def __init__(self, env: TrainJobStatusEnv, min_interval_seconds: float = MIN_INTERVAL_SECONDS) -> None:
        self.endpoint = StatusEndpoint(env)
        self.state = ProgressState()
        self.min_interval_seconds = min_interval_seconds
        self.num_sent = 0
        self._sent_version = 0
        self._lock = threading.Condition()
        self._closing = False
        self._has_warned = False
        self._last_send_failed = False
        self._sender = threading.Thread(target=self._send_loop, name="trainjob-status", daemon=True)
        self._sender.start()

    def log_params(self, params: dict[str, Any]) -> None:
        pass

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        with self._lock:
            self.state.update(metrics, step)
            self._lock.notify_all()

    def log_model(self, directory: Path) -> None:
        pass

    def close(self) -> None:
        """Send the last state, whatever the interval, within `CLOSE_SECONDS` in all; not where a send still
        hangs or the last one failed (the endpoint is away: waiting on it again would only delay the exit)."""
        deadline = time.monotonic() + CLOSE_SECONDS
        with self._lock:
            self._closing = True
            self._lock.notify_all()
        self._sender.join(timeout=CLOSE_SECONDS)
        if self._sender.is_alive() or self._last_send_failed:
            return
        self._send_latest(timeout=max(0.1, deadline - time.monotonic()))

    def _send_loop(self) -> None:
        while True:
            with self._lock:
                while self.state.version == self._sent_version and not self._closing:
                    self._lock.wait()
                if self._closing:
                    return
            self._send_latest()
            with self._lock:  # the rate bound: wait out the interval (close ends the wait)
                self._lock.wait_for(lambda: self._closing, timeout=self.min_interval_seconds)

    def _send_latest(self, timeout: float = REQUEST_TIMEOUT_SECONDS) -> None:
        with self._lock:
            if self.state.version == self._sent_version:
                return
            version, payload = self.state.version, self.state.trainer_status()
        try:
            self.endpoint.send(payload, timeout)
        except ServiceError as err:
            self._last_send_failed = True
            if not self._has_warned:
                logger.warning("cannot report progress to the TrainJob (%s); training goes on, later failures are "
                               "not logged", redact_text(str(err)))
                self._has_warned = True
            return
        self._last_send_failed = False
        with self._lock:
            self._sent_version = max(self._sent_version, version)
            self.num_sent += 1


def build_status_reporter(env: TrainJobStatusEnv | None) -> TrainJobStatusReporter | None:
    """The reporter where the TrainJob takes progress (`env` set), else None."""
    if env is None:
        return None
    logger.info("reporting progress to TrainJob status endpoint %s", env.url)
    return TrainJobStatusReporter(env)
