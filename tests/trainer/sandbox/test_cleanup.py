"""Deleting the scratch folder never follows a link the program left there (a root trainer would chmod `/usr`)."""

from __future__ import annotations

import os
import textwrap

import pytest

from tests.trainer.sandbox.kernel import skip_without_the_local_sandbox
from trainer.sandbox import SandboxLimits, SandboxUnavailableError, check_sandbox, run_python
from trainer.sandbox.local import _remove_scratch


def plant_links(scratch, outside_folder, outside_file) -> None:
    """What a program can leave: links to folders and files outside, a folder it locked, a loop."""
    os.symlink(outside_folder, scratch / "looks_like_a_folder")
    os.symlink(outside_file, scratch / "looks_like_a_file")
    (scratch / "locked" / "deeper").mkdir(parents=True)
    os.symlink(outside_folder, scratch / "locked" / "deeper" / "link")
    (scratch / "locked" / "deeper" / "kept.txt").write_text("x")
    os.chmod(scratch / "locked" / "deeper", 0)
    os.chmod(scratch / "locked", 0)
    os.symlink(scratch / "loop", scratch / "loop")


def test_cleanup_removes_everything_and_changes_nothing_a_link_points_at(tmp_path):
    scratch, outside = tmp_path / "scratch", tmp_path / "outside"
    scratch.mkdir()
    outside.mkdir(mode=0o750)
    (outside / "model.safetensors").write_text("weights")
    os.chmod(outside / "model.safetensors", 0o600)
    os.chmod(outside, 0o750)
    plant_links(scratch, outside, outside / "model.safetensors")
    _remove_scratch(str(scratch))
    assert not scratch.exists()
    assert oct(os.stat(outside).st_mode & 0o7777) == "0o750"
    assert oct(os.stat(outside / "model.safetensors").st_mode & 0o7777) == "0o600"
    assert (outside / "model.safetensors").read_text() == "weights"


LEAVES_LINKS = textwrap.dedent("""
    import os
    os.symlink(TARGET, "looks_like_a_folder")
    os.makedirs("locked/deeper")
    os.symlink(TARGET, "locked/deeper/link")
    os.mkdir("locked/closed", 0)
    print("left")
""")


def test_links_a_program_leaves_do_not_reach_the_trainers_folders(stand_in):
    target = stand_in.base / "checkpoints"
    target.mkdir(mode=0o750, exist_ok=True)
    os.chmod(target, 0o750)
    if os.geteuid() == 0:
        os.chown(target, stand_in.uid, stand_in.uid)  # the trainer's own: it could chmod it, if it followed
    result = stand_in.run(f"TARGET = {str(target)!r}\n" + LEAVES_LINKS)
    assert result["stdout"] == "left\n", result["stderr"]
    assert oct(os.stat(target).st_mode & 0o7777) == "0o750"
    assert not list((stand_in.base / "tmp").glob("alignflow-sandbox-*"))  # and the scratch folder is gone


def test_as_root_links_the_program_leaves_reach_nothing(tmp_path):
    """A root trainer's cleanup may change any path: a link to a root-owned folder must keep its mode."""
    if os.geteuid() != 0:
        pytest.skip("only a root trainer's cleanup could change a folder it does not own")
    skip_without_the_local_sandbox()
    try:
        check_sandbox()
    except SandboxUnavailableError as err:
        pytest.skip(f"the sandbox cannot start here: {err}")
    target = tmp_path / "system"
    target.mkdir()
    os.chmod(target, 0o755)
    result = run_python(f"TARGET = {str(target)!r}\n" + LEAVES_LINKS, limits=SandboxLimits(wall_seconds=10))
    assert result.stdout == "left\n", result.stderr
    assert oct(os.stat(target).st_mode & 0o7777) == "0o755"
