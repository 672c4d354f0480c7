"""Where an online state's arrays live: blocks of memory with names, so that the process that
changes a state (the ingest worker) and the process that reads it (the endpoint's requests) see
the same bytes.

- :class:`SharedBlocks`: files in ``/dev/shm`` mapped by each process that opens them (the
  server's, with its worker a process). A block's name holds the pid of the process that made
  it: blocks of processes that are gone (an endpoint killed with its worker) are removed by
  :func:`remove_orphans` when the next worker starts.
- :class:`LocalBlocks`: arrays of this process under their names (tests, a worker in a thread).

A block is never resized: a state that needs a larger one makes a new block, copies, publishes
the new name (:mod:`serving.online.header`) and unlinks the old; a reader that still maps the
old one keeps reading it (an unlinked file's mapping stays valid) until it opens the new one.
"""

from __future__ import annotations

import contextlib
import itertools
import mmap
import os
import secrets
from pathlib import Path
from typing import Protocol

import numpy as np

BLOCK_PREFIX = "hybridflow-state-"
SHM = Path("/dev/shm")


class BlockGone(RuntimeError):
    """A block named by a state's header is not there (replaced meanwhile, or released)."""


class Blocks(Protocol):
    def allocate(self, shape: tuple[int, ...], dtype: np.dtype | str) -> tuple[str, np.ndarray]:
        """A new zeroed block holding an array of ``shape``; its name and the array."""
        ...

    def attach(self, name: str, shape: tuple[int, ...], dtype: np.dtype | str) -> np.ndarray:
        """The array in block ``name`` (:class:`BlockGone` when there is none)."""
        ...

    def unlink(self, name: str) -> None:
        """Remove block ``name`` (its mappings stay valid while they live); none is fine."""
        ...


def _nbytes(shape: tuple[int, ...], dtype: np.dtype | str) -> int:
    return max(int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize, 1)


def _view(buffer: object, shape: tuple[int, ...], dtype: np.dtype | str) -> np.ndarray:
    count = int(np.prod(shape, dtype=np.int64))
    return np.frombuffer(buffer, dtype=dtype, count=count).reshape(shape)  # type: ignore[call-overload]


class SharedBlocks:
    """Blocks as files in a folder in memory (``/dev/shm``), mapped shared."""

    def __init__(self, folder: Path = SHM) -> None:
        self.folder = folder
        self._tag = secrets.token_hex(4)
        self._numbers = itertools.count()

    def __getstate__(self) -> dict:
        return {"folder": self.folder}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["folder"])  # type: ignore[misc]

    def allocate(self, shape: tuple[int, ...], dtype: np.dtype | str) -> tuple[str, np.ndarray]:
        name = f"{BLOCK_PREFIX}{os.getpid()}-{self._tag}-{next(self._numbers)}"
        path = self.folder / name
        size = _nbytes(shape, dtype)
        with open(path, "xb+") as f:
            try:  # the pages taken now: a full folder is this error, not a crash on a write
                os.posix_fallocate(f.fileno(), 0, size)
            except OSError as exc:
                f.close()
                path.unlink()
                raise OSError(
                    exc.errno,
                    f"{self.folder} has no room for {size:,} bytes of online state ({exc.strerror};"
                    " a container's /dev/shm is 64 MB unless it is given more: --shm-size)",
                ) from None
            mapped = mmap.mmap(f.fileno(), 0)
        return name, _view(mapped, shape, dtype)

    def attach(self, name: str, shape: tuple[int, ...], dtype: np.dtype | str) -> np.ndarray:
        if not name.startswith(BLOCK_PREFIX) or "/" in name:
            raise ValueError(f"{name!r} is not an online state block")
        try:
            with open(self.folder / name, "rb+") as f:
                mapped = mmap.mmap(f.fileno(), 0)
        except FileNotFoundError:
            raise BlockGone(f"{self.folder / name} is gone") from None
        if len(mapped) < _nbytes(shape, dtype):
            raise BlockGone(f"{self.folder / name} is smaller than its array")
        return _view(mapped, shape, dtype)

    def unlink(self, name: str) -> None:
        if name.startswith(BLOCK_PREFIX) and "/" not in name:
            with contextlib.suppress(FileNotFoundError):
                (self.folder / name).unlink()


class LocalBlocks:
    """Blocks as arrays of this process, by name (a state read and changed in one process)."""

    def __init__(self) -> None:
        self._arrays: dict[str, np.ndarray] = {}
        self._tag = secrets.token_hex(4)
        self._numbers = itertools.count()

    def allocate(self, shape: tuple[int, ...], dtype: np.dtype | str) -> tuple[str, np.ndarray]:
        name = f"{BLOCK_PREFIX}local-{self._tag}-{next(self._numbers)}"
        self._arrays[name] = np.zeros(shape, dtype=dtype)
        return name, self._arrays[name]

    def attach(self, name: str, shape: tuple[int, ...], dtype: np.dtype | str) -> np.ndarray:
        try:
            array = self._arrays[name]
        except KeyError:
            raise BlockGone(f"block {name} is gone") from None
        return array.reshape(shape)

    def unlink(self, name: str) -> None:
        self._arrays.pop(name, None)

    @property
    def names(self) -> list[str]:
        return list(self._arrays)


def block_files(folder: Path = SHM) -> list[Path]:
    """The online state blocks in ``folder``."""
    return sorted(folder.glob(f"{BLOCK_PREFIX}*")) if folder.is_dir() else []


def remove_orphans(folder: Path = SHM) -> int:
    """Remove the blocks whose maker is gone (an endpoint killed with its worker); how many."""
    removed = 0
    for path in block_files(folder):
        pid = path.name.removeprefix(BLOCK_PREFIX).split("-", 1)[0]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            with contextlib.suppress(OSError):
                path.unlink()
                removed += 1
    return removed
