"""Local filesystem storage: plain paths and `file://` URIs.

`create_exclusive` is atomic (a complete temporary file is hard-linked into place, which fails if
the name exists); `replace_if_unchanged` compares and then renames, which is atomic against readers
but not against a second writer racing in the same instant (POSIX has no compare-and-swap rename).

Files written through a temporary file (`tempfile.mkstemp`, and safetensors' own writer) are created
with mode 0600; `give_default_mode` gives them the mode `open()` would have (0666 less the umask), so
an output a pod writes as its own user can be read by the next one, as the other outputs can.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from trainer.errors import StorageError
from trainer.storage.base import check_scheme


def default_file_mode() -> int:
    """0o666 less this process's umask: the mode `open()` creates files with."""
    # os.umask can only be read by setting it, which races with threads creating files; Linux shows it in
    # /proc (since 4.7). Elsewhere assume the common 022.
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return 0o666 & ~int(line.split()[1], 8)
    except OSError:
        pass
    return 0o644


def give_default_mode(*paths: Path) -> None:
    """Set each file (every file below a folder) to `default_file_mode()`."""
    mode = default_file_mode()
    for path in paths:
        for file in (path.rglob("*") if path.is_dir() else [path]):
            if file.is_file():
                file.chmod(mode)


def local_path(uri: str | Path) -> Path:
    """The path of a local `uri` (a plain path or `file://`); any other scheme is refused, never read as a path."""
    text = str(uri)
    if text.startswith("file://"):
        return Path(text[len("file://"):])
    check_scheme(text)
    return Path(text)


def directory_problem(uri: str | Path) -> str | None:
    """Why the local `uri` cannot be or become a directory this process writes in (it, or a folder above it, is a
    file, or the nearest existing folder is not writable by this user), or None."""
    path = local_path(uri)
    for candidate in (path, *path.parents):
        if candidate.exists():
            if not candidate.is_dir():
                return f"{path} is a file, expected a directory" if candidate == path else \
                    f"{candidate} is a file, so {path} cannot be a directory below it"
            if not os.access(candidate, os.W_OK | os.X_OK):  # an image's root-owned WORKDIR, a read-only mount
                where = "" if candidate == path else f"cannot be created: {candidate} "
                return f"{path} {where}is not writable by this user (uid {os.getuid()})"
            return None
    return None


@contextlib.contextmanager
def writing(uri: str) -> Iterator[None]:
    """Turn a failed local write into a StorageError naming `uri` (one line, not a traceback)."""
    try:
        yield
    except OSError as err:
        raise StorageError(f"{uri}: cannot write: {err.strerror or err}") from err


class LocalStorage:
    def exists(self, uri: str) -> bool:
        return local_path(uri).exists()

    def read_bytes(self, uri: str) -> bytes:
        try:
            return local_path(uri).read_bytes()
        except OSError as err:
            raise StorageError(f"{uri}: cannot read: {err.strerror}") from err

    def write_bytes(self, uri: str, data: bytes) -> None:
        path = local_path(uri)
        with writing(uri):
            os.replace(self._staged(path, data), path)

    def upload_file(self, local: Path, uri: str) -> None:
        target = local_path(uri)
        with writing(uri):
            target.parent.mkdir(parents=True, exist_ok=True)
            temporary = target.with_name(f".{target.name}.tmp")
            shutil.copyfile(local, temporary)
            os.replace(temporary, target)

    def download_file(self, uri: str, local: Path) -> None:
        if local_path(uri).resolve() != Path(local).resolve():
            local.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(local_path(uri), local)

    def list(self, prefix: str) -> list[str]:
        root = local_path(prefix)
        if not root.is_dir():
            return []
        scheme = "file://" if str(prefix).startswith("file://") else ""
        return sorted(f"{scheme}{p}" for p in root.rglob("*") if p.is_file() and not p.name.startswith("."))

    def delete(self, uri: str) -> None:
        path = local_path(uri)
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)

    def etag(self, uri: str) -> str:
        stat = local_path(uri).stat()
        return f"{stat.st_mtime_ns}-{stat.st_size}-{stat.st_ino}"

    def size(self, uri: str) -> int:
        return local_path(uri).stat().st_size

    def _staged(self, path: Path, data: bytes) -> str:
        """A complete temporary file beside `path`, holding `data`."""
        with writing(str(path)):
            path.parent.mkdir(parents=True, exist_ok=True)
            handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
            with os.fdopen(handle, "wb") as file:
                file.write(data)
            give_default_mode(Path(temporary))
            return temporary

    def create_exclusive(self, uri: str, data: bytes) -> str | None:
        path = local_path(uri)
        temporary = self._staged(path, data)
        try:
            os.link(temporary, path)
        except FileExistsError:
            return None
        finally:
            os.unlink(temporary)
        return self.etag(uri)

    def replace_if_unchanged(self, uri: str, data: bytes, etag: str) -> str | None:
        path = local_path(uri)
        temporary = self._staged(path, data)
        try:
            if not path.exists() or self.etag(uri) != etag:
                return None
            os.replace(temporary, path)
            temporary = None
            return self.etag(uri)
        finally:
            if temporary is not None:
                os.unlink(temporary)
