"""The intra-op thread count: set on purpose from `train.num_threads` or from the CPUs the process may use."""

from __future__ import annotations

import logging
import os

import pytest
import torch

from tests.conftest import make_config
from trainer.lifecycle.context import build_context, close_context
from trainer.runtime import available_cpus, cgroup_cpu_quota, configure_threads

AFFINITY = len(os.sched_getaffinity(0))


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def cpu_max(tmp_path, text: str) -> str:
    path = tmp_path / "cpu.max"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(("text", "quota"), [("max 100000\n", None), ("150000 100000\n", 1.5),
                                              ("400000 100000\n", 4.0), ("50000 100000\n", 0.5)])
def test_cgroup_v2_quota_is_quota_over_period(tmp_path, text, quota):
    assert cgroup_cpu_quota(cpu_max(tmp_path, text), str(tmp_path / "absent")) == quota


def test_cgroup_v1_quota_is_read_when_v2_is_absent(tmp_path):
    (tmp_path / "cpu.cfs_quota_us").write_text("250000\n")
    (tmp_path / "cpu.cfs_period_us").write_text("100000\n")
    assert cgroup_cpu_quota(str(tmp_path / "absent"), str(tmp_path / "cpu.cfs_quota_us")) == 2.5
    (tmp_path / "cpu.cfs_quota_us").write_text("-1\n")  # v1's "no limit"
    assert cgroup_cpu_quota(str(tmp_path / "absent"), str(tmp_path / "cpu.cfs_quota_us")) is None


def test_available_cpus_are_capped_by_the_quota_rounded_down_and_at_least_one(tmp_path):
    absent = str(tmp_path / "absent")
    assert available_cpus(cpu_max(tmp_path, "max 100000"), absent) == AFFINITY
    assert available_cpus(cpu_max(tmp_path, "150000 100000"), absent) == 1
    assert available_cpus(cpu_max(tmp_path, "50000 100000"), absent) == 1
    assert available_cpus(cpu_max(tmp_path, f"{(AFFINITY + 8) * 100000} 100000"), absent) == AFFINITY


def test_default_threads_honour_cpu_max_and_are_shared_by_local_ranks(tmp_path, restore_threads, caplog):
    absent = str(tmp_path / "absent")
    with caplog.at_level(logging.INFO, logger="trainer.runtime"):
        assert configure_threads(None, {}, cpu_max=cpu_max(tmp_path, "100000 100000"), v1_quota=absent) == 1
    assert torch.get_num_threads() == 1
    assert "torch intra-op threads: 1 (1 CPUs available (cgroup quota 1)" in caplog.text
    if AFFINITY >= 2:
        limit = cpu_max(tmp_path, "200000 100000")
        assert configure_threads(None, {}, cpu_max=limit, v1_quota=absent) == 2
        assert configure_threads(None, {"LOCAL_WORLD_SIZE": "2"}, cpu_max=limit, v1_quota=absent) == 1


def test_an_explicit_count_wins_over_the_quota(tmp_path, restore_threads, caplog):
    with caplog.at_level(logging.INFO, logger="trainer.runtime"):
        assert configure_threads(3, {}, cpu_max=cpu_max(tmp_path, "100000 100000")) == 3
    assert torch.get_num_threads() == 3
    assert "torch intra-op threads: 3 (train.num_threads)" in caplog.text


def test_a_stage_sets_and_logs_its_threads_at_start(tmp_path, tiny_model, task_files, restore_threads, caplog):
    torch.set_num_threads(1)
    config = make_config("sft", tmp_path / "run", tiny_model, task_files["sft_train"], train={"num_threads": 2})
    with caplog.at_level(logging.INFO, logger="trainer.runtime"):
        context = build_context(config)
    close_context(context)
    assert torch.get_num_threads() == 2
    assert "torch intra-op threads: 2 (train.num_threads)" in caplog.text


def test_num_threads_must_be_positive(tmp_path, tiny_model, task_files):
    from trainer.errors import ConfigError

    with pytest.raises(ConfigError, match="train.num_threads"):
        make_config("sft", tmp_path / "run", tiny_model, task_files["sft_train"], train={"num_threads": 0})
