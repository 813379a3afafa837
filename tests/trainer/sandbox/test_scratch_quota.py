"""The run's files are counted: as memory where the scratch folder is a tmpfs, and against `max_scratch_bytes`
everywhere, including files hidden in a folder nobody may list and files deleted but still held open or
mapped.

Each escape is first shown working outside the sandbox: the files are held while the process's resident
memory stays far below them (what `memory_bytes` used to count), or while a walk of the folder sees none of
them (what a folder quota alone would count).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import textwrap

import pytest

from trainer.sandbox.local import in_memory

MiB = 1 << 20


def holding(files: str) -> str:
    """A program that writes 40 MiB files as `files` (code using `write(path)`) says, then holds them 30 s
    and prints what it held, its peak resident memory and what a walk of its folder finds."""
    return textwrap.dedent("""
        import json, mmap, os, resource, time
        chunk, held = b"x" * (1 << 20), []
        def write(path, keep_open=False):
            descriptor = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
            for _ in range(40):
                os.write(descriptor, chunk)
            held.append(descriptor) if keep_open else os.close(descriptor)
            return descriptor
    """) + textwrap.dedent(files) + textwrap.dedent("""
        walked = sum(os.lstat(os.path.join(folder, name)).st_blocks * 512
                     for folder, _, names in os.walk(".") for name in names)
        print(json.dumps({"peak_resident": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                          "walked": walked}), flush=True)
        time.sleep(30)
    """)


FIVE_FILES = holding("for index in range(5):\n    write(f'file-{index}')\nfolder = '.'\n")
HIDDEN_FOLDER = holding("os.mkdir('hidden', 0o300)\nfor index in range(3):\n    write(f'hidden/file-{index}')\n"
                        "folder = '.'\n")
DELETED_OPEN = holding("for index in range(3):\n    write(f'file-{index}', keep_open=True)\n"
                       "    os.unlink(f'file-{index}')\nfolder = '.'\n")
DELETED_MAPPED = holding("maps = []\nfor index in range(3):\n    descriptor = write(f'file-{index}', keep_open=True)\n"
                         "    maps.append(mmap.mmap(descriptor, 40 << 20))\n    os.close(held.pop())\n"
                         "    os.unlink(f'file-{index}')\nfolder = '.'\n")


def plain_report(stand_in, code: str, folder: str) -> dict:
    """What `code` reports run unsandboxed (as the stand-in) in a fresh folder under `folder`, stopped after it
    printed; the folder is removed."""
    workdir = tempfile.mkdtemp(dir=folder)
    os.chmod(workdir, 0o777)
    try:
        runner = (f"import os, subprocess, sys\nos.chdir({workdir!r})\n"
                  f"process = subprocess.Popen([sys.executable, '-c', {code!r}], stdout=subprocess.PIPE, text=True)\n"
                  "print(process.stdout.readline(), end='')\nprocess.kill()\n")
        done = stand_in.run_plain(runner)
        assert done["exit_code"] == 0 and done["stdout"], done["stderr"]
        return json.loads(done["stdout"])
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture
def memory_folder(stand_in):
    """A folder on a tmpfs that the stand-in's uid may write, standing for an `emptyDir` with `medium: Memory`."""
    if stand_in.image is not None:
        pytest.skip("the tmpfs scratch case runs outside the image (the pod has no tmpfs folder of ours)")
    if not os.path.isdir("/dev/shm") or not in_memory("/dev/shm") or shutil.disk_usage("/dev/shm").free < 512 * MiB:
        pytest.skip("needs /dev/shm as a tmpfs with 512 MiB free, to stand for a memory-backed scratch folder")
    folder = tempfile.mkdtemp(dir="/dev/shm", prefix="alignflow-tmpfs-")
    os.chmod(folder, 0o755)
    if os.geteuid() == 0:
        os.chown(folder, stand_in.uid, stand_in.uid)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_files_in_a_tmpfs_scratch_folder_count_as_memory(stand_in, memory_folder):
    """200 MiB of files in a tmpfs, under a 64 MiB memory limit, with resident memory far below it."""
    plain = plain_report(stand_in, FIVE_FILES, memory_folder)
    assert plain["walked"] >= 200 * MiB and plain["peak_resident"] < 64 * MiB
    inside = stand_in.run_in(memory_folder, FIVE_FILES, memory_bytes=64 * MiB, max_scratch_bytes=1 << 30,
                             wall_seconds=20)
    assert inside["memory_exceeded"] and inside["exit_code"] is None and not inside["timed_out"]
    assert inside["seconds"] < 15
    assert os.listdir(memory_folder) == []  # and the scratch folder went with the run


def test_files_on_disk_are_not_memory_but_count_against_the_scratch_limit(stand_in):
    roomy = stand_in.run(FIVE_FILES, memory_bytes=64 * MiB, max_scratch_bytes=1 << 30, wall_seconds=2)
    assert roomy["timed_out"] and not roomy["memory_exceeded"] and not roomy["scratch_exceeded"]
    assert json.loads(roomy["stdout"])["walked"] >= 200 * MiB
    tight = stand_in.run(FIVE_FILES, max_scratch_bytes=64 * MiB, wall_seconds=20)
    assert tight["scratch_exceeded"] and tight["exit_code"] is None and tight["seconds"] < 15


@pytest.mark.parametrize("code", [HIDDEN_FOLDER, DELETED_OPEN, DELETED_MAPPED],
                         ids=["in-a-folder-nobody-may-list", "deleted-but-open", "deleted-but-mapped"])
def test_files_a_folder_walk_cannot_see_are_counted(stand_in, code):
    """120 MiB held where a plain walk of the folder finds nothing (listing refused, or no name left)."""
    plain = plain_report(stand_in, code, str(stand_in.base / "tmp"))
    assert plain["walked"] < 1 * MiB
    inside = stand_in.run(code, max_scratch_bytes=64 * MiB, wall_seconds=20)
    assert inside["scratch_exceeded"] and inside["exit_code"] is None and inside["seconds"] < 15
