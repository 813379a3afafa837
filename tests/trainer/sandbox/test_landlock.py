"""Landlock on its own (no seccomp): the filesystem rules, the TCP rule and signal scoping each hold."""

from __future__ import annotations

import os
import signal
import socket

import pytest

from tests.trainer.sandbox.forked import error_name, in_child
from tests.trainer.sandbox.kernel import skip_without_the_local_sandbox
from trainer.sandbox import _landlock


@pytest.fixture(autouse=True)
def needs_landlock():
    skip_without_the_local_sandbox()


def test_reads_writes_and_tcp_outside_the_rules_are_refused(tmp_path):
    (tmp_path / "inside").mkdir()
    (tmp_path / "outside.txt").write_text("kept")
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def confined():
        _landlock.restrict_self(read_paths=["/usr", "/lib", "/lib64"], write_paths=[str(tmp_path / "inside")])
        (tmp_path / "inside" / "new.txt").write_text("fine")
        with socket.socket() as client:
            connect = error_name(lambda: client.connect(("127.0.0.1", port)))
        return {"write outside": error_name(lambda: open(tmp_path / "outside.txt", "w")),
                "read outside": error_name(lambda: open(tmp_path / "outside.txt")),
                "read inside": open(tmp_path / "inside" / "new.txt").read(),
                "tcp connect": connect,
                "tcp bind": error_name(lambda: socket.create_server(("127.0.0.1", 0)))}

    try:
        assert in_child(confined) == {"write outside": "EACCES", "read outside": "EACCES", "read inside": "fine",
                                      "tcp connect": "EACCES", "tcp bind": "EACCES"}
    finally:
        server.close()
    assert (tmp_path / "outside.txt").read_text() == "kept"


def test_a_scoping_only_domain_keeps_the_filesystem_but_cannot_signal_out(tmp_path):
    parent = os.getpid()

    def scoped():
        _landlock.restrict_self(handle_fs=False, handle_tcp=False)
        (tmp_path / "written").write_text("yes")
        return error_name(lambda: os.kill(parent, signal.SIGCONT))

    assert in_child(scoped) == "EPERM"
    assert (tmp_path / "written").read_text() == "yes"


def test_every_abi_asks_only_for_the_rights_it_knows():
    assert _landlock.fs_rights(1) == (1 << 13) - 1
    assert _landlock.fs_rights(4) == (1 << 15) - 1  # ABI 4 added TCP rules, no filesystem right
    assert _landlock.fs_rights(7) == (1 << 16) - 1
