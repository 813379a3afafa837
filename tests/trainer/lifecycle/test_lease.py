"""The lease on a local output_dir: one live holder, named in the refusal; stale leases are taken over."""

from __future__ import annotations

import json
import socket
import time

import pytest

from trainer.errors import LeaseError
from trainer.lifecycle.lease import LEASE_FILE, Lease


def test_a_live_lease_refuses_a_second_run_naming_the_holder(tmp_path):
    holder = Lease(str(tmp_path), timeout_seconds=60)
    holder.holder["pid"] = 1  # another live process on this host (init never dies)
    holder.acquire()
    try:
        second = Lease(str(tmp_path), timeout_seconds=60)
        with pytest.raises(LeaseError, match=rf"in use by another run \(host {socket.gethostname()}, pid 1, "
                                             r"started .*, last heartbeat \d+ s ago\)"):
            second.check_free()
        with pytest.raises(LeaseError):
            second.acquire()
    finally:
        holder.release()
    assert not (tmp_path / LEASE_FILE).exists()


def write_lease(path, **holder) -> None:
    path.mkdir(parents=True, exist_ok=True)
    record = {"host": "other-pod", "pid": 7, "started": "2026-01-01T00:00:00+00:00", "token": "x",
              "heartbeat": time.time()}
    (path / LEASE_FILE).write_text(json.dumps({**record, **holder}))


def test_a_lease_without_heartbeat_for_the_timeout_is_taken_over(tmp_path):
    write_lease(tmp_path, heartbeat=time.time() - 120)
    lease = Lease(str(tmp_path), timeout_seconds=60)
    lease.acquire()
    try:
        assert json.loads((tmp_path / LEASE_FILE).read_text())["token"] == lease.holder["token"]
    finally:
        lease.release()


def test_a_dead_holder_on_this_host_is_stale_at_once(tmp_path):
    write_lease(tmp_path, host=socket.gethostname(), pid=2**22 + 12345)  # no such process
    lease = Lease(str(tmp_path), timeout_seconds=3600)
    lease.check_free()
    lease.acquire()
    lease.release()


def test_a_fresh_lease_on_another_host_is_live(tmp_path):
    write_lease(tmp_path)
    with pytest.raises(LeaseError, match="host other-pod, pid 7"):
        Lease(str(tmp_path), timeout_seconds=60).check_free()


def test_heartbeat_renews_and_notices_a_takeover(tmp_path, caplog):
    lease = Lease(str(tmp_path), timeout_seconds=0.4)  # beats every 0.1 s
    lease.acquire()
    first = json.loads((tmp_path / LEASE_FILE).read_text())["heartbeat"]
    time.sleep(0.5)
    assert json.loads((tmp_path / LEASE_FILE).read_text())["heartbeat"] > first
    write_lease(tmp_path, token="someone-else")  # taken over (e.g. after a long pause)
    time.sleep(0.5)
    lease.release()
    assert json.loads((tmp_path / LEASE_FILE).read_text())["token"] == "someone-else"  # not deleted: not ours
    assert "lost its lease" in caplog.text
