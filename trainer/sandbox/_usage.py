"""What a sandboxed run holds: the resident memory of its processes, and the bytes its files take.

Standard library only: the supervisor (`_supervisor.py`) imports this file by name under `python -I -S` and
calls it every poll, so each function reads only /proc and the scratch folder, never follows a link the
program made, and ends however the program shapes its folder.
"""

from __future__ import annotations

import os
import stat

PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
# What each name in the scratch folder costs the kernel (inode and dentry) beyond its data, charged so that a
# million empty files count too.
ENTRY_BYTES = 1024
# Deeper than this no path can name (PATH_MAX / 2); the walk holds one descriptor per level.
MAX_DEPTH = 2048
DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def run_processes(root: int) -> list[int]:
    """Every descendant of `root`. Orphans are reparented to the supervisor (a subreaper), so its
    descendants are the whole run."""
    found, pending = [], _children(root)
    while pending:
        pid = pending.pop()
        found.append(pid)
        pending += _children(pid)
    return found


def resident_bytes(pids: list[int]) -> int:
    """Resident memory of `pids` together (pages a fork shares are counted in each process, so this errs high)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/statm", "rb") as statm:
                total += int(statm.read().split()[1]) * PAGE_SIZE
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
    return total


def file_bytes(scratch: str, pids: list[int]) -> int:
    """Bytes the run's files take on the scratch folder's filesystem: everything beneath `scratch`, plus the
    files `pids` deleted but still hold open or mapped (a deleted file keeps its pages until the last holder
    lets go, and no folder walk sees it)."""
    try:
        top = os.open(scratch, DIRECTORY_FLAGS)
    except OSError:
        return 0
    try:
        device = os.fstat(top).st_dev
        return _folder_bytes(top, 0) + _deleted_bytes(pids, device)
    finally:
        os.close(top)


def _folder_bytes(folder: int, depth: int) -> int:
    """Allocated bytes of every entry beneath the open folder `folder`, entered by descriptor (no links)."""
    total = 0
    try:
        with os.scandir(folder) as entries:
            for entry in entries:
                try:
                    info = entry.stat(follow_symlinks=False)
                except OSError:
                    continue  # removed meanwhile
                total += info.st_blocks * 512 + ENTRY_BYTES
                if stat.S_ISDIR(info.st_mode) and depth < MAX_DEPTH:
                    child = _open_folder(entry.name, folder)
                    if child is not None:
                        try:
                            total += _folder_bytes(child, depth + 1)
                        finally:
                            os.close(child)
    except OSError:
        pass  # replaced meanwhile
    return total


def _open_folder(name: str, parent: int) -> int | None:
    """`name` in `parent` opened for listing, without following a link. The program cannot chmod (seccomp),
    but it can create a folder with mode 0: the supervisor, its owner, opens it up to look inside."""
    try:
        return os.open(name, DIRECTORY_FLAGS, dir_fd=parent)
    except PermissionError:
        pass
    except OSError:
        return None  # a link, or gone
    try:
        handle = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
    except OSError:
        return None
    try:
        os.chmod(f"/proc/self/fd/{handle}", 0o700)  # this very inode: nothing is looked up again
        return os.open(f"/proc/self/fd/{handle}", DIRECTORY_FLAGS)
    except OSError:
        return None
    finally:
        os.close(handle)


def _deleted_bytes(pids: list[int], device: int) -> int:
    """Bytes of the deleted files on `device` that `pids` hold: each file's allocated blocks where a
    descriptor still names it, or the size of its mappings where that is larger (a file only mapped can be
    measured no other way; forks' shared mappings are counted in each, so this errs high)."""
    held: dict[int, int] = {}
    mapped: dict[int, int] = {}
    wanted = f"{os.major(device):02x}:{os.minor(device):02x}"
    for pid in pids:
        try:
            descriptors = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            descriptors = []  # gone meanwhile
        for descriptor in descriptors:
            try:
                info = os.stat(f"/proc/{pid}/fd/{descriptor}")
            except OSError:
                continue
            if info.st_dev == device and info.st_nlink == 0 and stat.S_ISREG(info.st_mode):
                held[info.st_ino] = max(held.get(info.st_ino, 0), info.st_blocks * 512)
        try:
            with open(f"/proc/{pid}/maps", "rb") as maps:
                lines = maps.read().decode(errors="replace").splitlines()
        except OSError:
            lines = []
        for line in lines:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[3] == wanted and fields[5].endswith(" (deleted)"):
                start, end = (int(address, 16) for address in fields[0].split("-"))
                mapped[int(fields[4])] = mapped.get(int(fields[4]), 0) + end - start
    return sum(max(held.get(inode, 0), mapped.get(inode, 0)) for inode in held.keys() | mapped.keys())


def _children(pid: int) -> list[int]:
    """Child processes of `pid`, from every thread's `children` list (CONFIG_PROC_CHILDREN; empty without)."""
    found = []
    try:
        for thread in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{thread}/children", "rb") as children:
                found += [int(child) for child in children.read().split()]
    except OSError:
        pass  # the process ended, or the kernel does not list children
    return found
