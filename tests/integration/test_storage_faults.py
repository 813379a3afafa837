"""S3 storage under faults (moto behind a loopback fault proxy): retries to a deadline for every call,
conditional writes, the output_dir lease on S3, and background checkpoint saves that fail and recover."""

from __future__ import annotations

import logging
import threading
import time

import pytest
import torch

from tests.integration.fault_proxy import FaultProxy
from trainer.checkpointing.checkpoint import CheckpointManager, TrainerState
from trainer.errors import CheckpointError, LeaseError, StorageError
from trainer.lifecycle.lease import Lease
from trainer.parallel.booster import Booster, SinglePlugin
from trainer.runtime import DistributedEnv
from trainer.storage.s3 import S3Storage


@pytest.fixture
def proxy(s3_env, monkeypatch):
    """A fault proxy in front of moto; the shared S3 client goes through it with a 20 s deadline."""
    fault_proxy = FaultProxy(int(s3_env.rsplit(":", 1)[1]))
    monkeypatch.setenv("AWS_ENDPOINT_URL", fault_proxy.endpoint)
    S3Storage._shared = S3Storage(retry_seconds=20)
    yield fault_proxy
    S3Storage._shared = None
    fault_proxy.close()


def restore_after(proxy: FaultProxy, seconds: float) -> None:
    threading.Timer(seconds, proxy.restore).start()


@pytest.mark.parametrize("call", ["exists", "list", "read_bytes", "write_bytes"])
def test_every_call_rides_out_a_short_outage(call, proxy, bucket):
    storage = S3Storage.shared()
    storage.write_bytes(f"s3://{bucket}/a/b", b"x")
    proxy.cut()
    restore_after(proxy, 1.5)
    started = time.monotonic()
    arguments = {"exists": (f"s3://{bucket}/a/b",), "list": (f"s3://{bucket}/a",),
                 "read_bytes": (f"s3://{bucket}/a/b",), "write_bytes": (f"s3://{bucket}/a/c", b"y")}[call]
    result = getattr(storage, call)(*arguments)
    assert time.monotonic() - started > 1.2 and proxy.refused > 0
    assert result == {"exists": True, "list": [f"s3://{bucket}/a/b"], "read_bytes": b"x", "write_bytes": None}[call]


def test_an_outage_past_the_deadline_is_one_error_naming_the_endpoint(proxy, bucket):
    storage = S3Storage(retry_seconds=2)
    proxy.cut()
    with pytest.raises(StorageError, match=rf"s3://{bucket}/k: cannot check at S3 endpoint {proxy.endpoint}: .*"
                                           r"\(retried \d+ times over \d+ s; ALIGNFLOW_S3_RETRY_SECONDS is 2\)"):
        storage.exists(f"s3://{bucket}/k")


def test_conditional_writes(s3_endpoint, bucket):
    storage = S3Storage(retry_seconds=5)
    uri = f"s3://{bucket}/lease"
    first = storage.create_exclusive(uri, b"one")
    assert first is not None and storage.create_exclusive(uri, b"two") is None
    assert storage.replace_if_unchanged(uri, b"three", "0" * 32) is None
    assert storage.replace_if_unchanged(uri, b"three", first) is not None
    assert storage.read_bytes(uri) == b"three"


def test_lease_on_s3_refuses_a_live_holder_and_takes_over_a_stale_one(s3_endpoint, bucket):
    output = f"s3://{bucket}/runs/sft"
    holder = Lease(output, timeout_seconds=60)
    holder.holder.update(host="pod-a", pid=11)
    holder.acquire()
    with pytest.raises(LeaseError, match=r"lease.json: output_dir is in use by another run \(host pod-a, pid 11"):
        Lease(output, timeout_seconds=60).acquire()
    holder._stop.set()  # the holder dies: no more heartbeats
    holder.holder["heartbeat"] = 0
    taker = Lease(output, timeout_seconds=0.5)
    time.sleep(0.6)
    taker.acquire()
    assert taker.read_holder()[0]["token"] == taker.holder["token"]
    taker.release()
    assert taker.read_holder() == (None, None)


def small_manager(root: str) -> tuple[CheckpointManager, dict]:
    booster = Booster(SinglePlugin(DistributedEnv(0, 0, 1), torch.device("cpu")))
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    booster.register_optimizer(model, optimizer)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    return CheckpointManager(root, booster), {"model": (model, optimizer, scheduler)}


def test_failed_background_save_is_one_line_raised_by_wait_and_written_at_the_next_save(proxy, bucket, caplog):
    S3Storage._shared = S3Storage(retry_seconds=2)
    root = f"s3://{bucket}/checkpoints"
    manager, components = small_manager(root)
    manager.save(components, TrainerState(global_step=1), 1)
    proxy.cut()
    manager.save(components, TrainerState(global_step=2), 2, block=False)
    with pytest.raises(CheckpointError, match=rf"could not be written to {root}: .*last durable checkpoint: "
                                              rf"{root}/step-00000001"):
        manager.wait()
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "it is written again at the next save" in errors[0].getMessage()
    assert "\n" not in errors[0].getMessage() and errors[0].exc_info is None  # one line, no traceback

    proxy.restore()
    manager.save(components, TrainerState(global_step=3), 3)  # writes step 2 again, then step 3
    names = {uri.split("/")[4] for uri in S3Storage.shared().list(root) if uri.endswith("trainer_state.json")}
    assert names == {"step-00000001", "step-00000002", "step-00000003"}
    assert manager.latest() == f"{root}/step-00000003"
