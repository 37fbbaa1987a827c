"""Writing files and directories so that readers see the old version or the new one, never half.

A file is written to a temporary name in its own directory, flushed to disk, then renamed over the
target (`os.replace`, atomic on POSIX). A directory is assembled under a temporary name, then
renamed into place; an existing target directory is first renamed aside and removed afterwards.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile

from graphsync.io.errors import GraphFileError


def _default_mode(directory: bool = False) -> int:
    umask = os.umask(0)
    os.umask(umask)
    return (0o777 if directory else 0o666) & ~umask


def write_file(path: str, data: bytes) -> None:
    parent = os.path.dirname(os.path.abspath(path))
    try:
        fd, temp = tempfile.mkstemp(dir=parent, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    except OSError as exc:
        raise GraphFileError(f"cannot write {path}: {exc.strerror}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(temp, _default_mode())
        os.replace(temp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.remove(temp)
        raise GraphFileError(f"cannot write {path}: {exc.strerror or exc}") from None
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(temp)
        raise


@contextlib.contextmanager
def staged_directory(path: str):
    """Yields an empty temporary directory next to `path`; on success it becomes `path`."""
    path = os.path.abspath(path)
    parent = os.path.dirname(path)
    try:
        staging = tempfile.mkdtemp(dir=parent, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    except OSError as exc:
        raise GraphFileError(f"cannot write {path}: {exc.strerror}") from None
    try:
        yield staging
        os.chmod(staging, _default_mode(directory=True))
        _swap_into_place(staging, path)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _swap_into_place(staging: str, path: str) -> None:
    old = None
    try:
        if os.path.lexists(path):
            old = tempfile.mkdtemp(dir=os.path.dirname(path), prefix=f".{os.path.basename(path)}.", suffix=".old")
            os.rmdir(old)
            os.rename(path, old)
        os.rename(staging, path)
    except OSError as exc:
        if old and not os.path.lexists(path):
            with contextlib.suppress(OSError):
                os.rename(old, path)
        raise GraphFileError(f"cannot write {path}: {exc.strerror or exc}") from None
    if old:
        shutil.rmtree(old, ignore_errors=True)
