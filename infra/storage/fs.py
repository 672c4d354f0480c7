"""Durable local-filesystem primitives for the folder store.

- Files are written to a temporary name beside the target (created with mode 0666 minus the
  umask, like any other file the process writes), fsynced, renamed over the target, and the
  folder is fsynced so the rename itself survives a power cut.
- A failed write (disk full, quota, I/O error) removes its temporary file and raises
  :class:`~infra.errors.StoreError` naming what was being written.
- :func:`held_lock` serialises writers with ``flock(2)``: the kernel drops the lock when its
  holder dies (even by SIGKILL), so a lock can never be left behind; the lock file records its
  holder only so that a timeout can name it.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import fcntl
import json
import os
import shutil
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from infra.errors import StoreError

LOCK_TIMEOUT_S = 30.0
_FILE_MODE = 0o666  # the umask takes its share, as for open()


def describe_os_error(exc: OSError) -> str:
    """``"No space left on device (ENOSPC)"``-style text for an OSError."""
    name = errno.errorcode.get(exc.errno or 0, "")
    reason = exc.strerror or str(exc)
    return f"{reason} ({name})" if name else reason


def fsync_dir(path: Path) -> None:
    """Make the entries of folder ``path`` (new names, renames) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def temporary_beside(target: Path) -> Path:
    """A unique hidden name in the target's folder (listing skips dot-files)."""
    return target.with_name(f".{target.name}.{uuid.uuid4().hex}.tmp")


def write_bytes_durably(target: Path, data: bytes, what: str) -> None:
    """Write ``data`` at ``target`` atomically and durably; StoreError naming ``what``."""
    _replace_durably(target, what, lambda out: out.write(data))


def copy_file_durably(source: Path, target: Path, what: str) -> None:
    """Copy ``source`` to ``target`` atomically and durably; StoreError naming ``what``."""

    def copy(out: BinaryIO) -> None:
        with open(source, "rb") as src:
            shutil.copyfileobj(src, out, 1 << 20)

    _replace_durably(target, what, copy)


def _replace_durably(target: Path, what: str, write: Callable[[BinaryIO], object]) -> None:
    """Temporary file beside ``target`` -> write -> fsync -> rename -> fsync the folder.
    On failure the temporary file and the folders this call created are removed."""
    tmp = temporary_beside(target)
    created: list[Path] = []
    try:
        created = make_folders(target.parent)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, _FILE_MODE)
        with os.fdopen(fd, "wb") as out:
            write(out)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, target)
        fsync_dir(target.parent)
    except BaseException as exc:
        with contextlib.suppress(OSError):  # e.g. a file where a parent folder must be
            tmp.unlink(missing_ok=True)
        remove_empty_folders(created)
        if isinstance(exc, OSError):
            raise StoreError(f"could not write {what}: {describe_os_error(exc)}") from exc
        raise


def make_folders(folder: Path) -> list[Path]:
    """``mkdir -p folder``; returns the folders it created, outermost first."""
    missing = []
    while not folder.is_dir():
        missing.append(folder)
        folder = folder.parent
    for path in reversed(missing):
        path.mkdir(exist_ok=True)
    return list(reversed(missing))


def remove_empty_folders(created: list[Path]) -> None:
    """Undo :func:`make_folders` where nothing else was put in those folders since."""
    for path in reversed(created):
        try:
            path.rmdir()
        except OSError:
            return  # not empty: another writer is using it


def fsync_tree(root: Path) -> None:
    """fsync every file and folder below ``root`` (outputs Spark wrote without fsync)."""
    for folder, _, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(folder, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(Path(folder))


def lock_holder(lock: Path) -> str:
    """Who the lock file says holds (or last held) the lock, for error messages."""
    try:
        info = json.loads(lock.read_text() or "{}")
    except (OSError, ValueError):
        return "an unknown holder"
    return f"pid {info.get('pid')} on {info.get('host')} since {info.get('since')}"


@contextlib.contextmanager
def held_lock(lock: Path, what: str, timeout_s: float = LOCK_TIMEOUT_S) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``lock`` (created if missing, never deleted).

    A holder that dies releases the lock with its file descriptor, so a killed writer never
    blocks the next one; a live holder that keeps it past ``timeout_s`` gives a StoreError
    naming it.
    """
    lock.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, _FILE_MODE)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise StoreError(
                        f"{what}: lock {lock} still held by {lock_holder(lock)} after "
                        f"{timeout_s:.0f}s"
                    ) from None
                time.sleep(0.005)
            except OSError as exc:
                raise StoreError(
                    f"{what}: cannot lock {lock}: {describe_os_error(exc)} (the folder store "
                    "needs a filesystem with flock support)"
                ) from exc
        _record_holder(fd)
        yield
    finally:
        os.close(fd)  # releases the flock


def _record_holder(fd: int) -> None:
    since = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    info = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": since})
    with contextlib.suppress(OSError):  # diagnostics only: a full disk must not block the lock
        os.ftruncate(fd, 0)
        os.pwrite(fd, info.encode(), 0)
