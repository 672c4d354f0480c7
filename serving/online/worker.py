"""Where the endpoint runs :mod:`serving.online.prepare`'s work: in a worker process of its own
(:class:`ProcessWorker`, the server's default), or in a thread of the calling process
(:class:`ThreadWorker`: tests, and ``HYBRIDFLOW_SERVE__INGEST__WORKER=thread``).

Why a process: decoding, checking, summing and encoding a batch costs the CPU of several
milliseconds; in a thread of the serving process it holds the interpreter lock that every
``/predict`` needs, and each time a request gives the lock up (a socket, a torch operation) it
waits up to the switch interval to get it back. In a process of its own it runs on the other
core, and the serving process only reads its answer.

The worker is ``python -m serving.online.worker``: it reads calls from its stdin and writes
answers to its stdout, one at a time, each a length-prefixed pickle (both ends are this
package, over private pipes). The endpoint talks to it from its event loop (no thread takes the
interpreter lock for it); calls are taken in turn. A worker that died (killed, out of memory)
is started again on the next call, which is tried once more. It dies with the endpoint: it
exits when its stdin closes, and on Linux when its parent dies.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import fcntl
import logging
import mmap
import os
import pickle
import signal
import struct
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar

from serving.online import applier, prepare
from serving.online.blocks import Blocks, LocalBlocks, SharedBlocks
from serving.online.blocks import remove_orphans as remove_orphan_blocks

log = logging.getLogger(__name__)
T = TypeVar("T")
_HEADER = struct.Struct("<Q")
_CALLS: dict[str, Callable[..., Any]] = {
    "prepare_batch": prepare.prepare_batch,
    "decode_segment": prepare.decode_segment,
    "online_refusal": prepare.online_refusal,
    **{
        fn.__name__: fn
        for fn in (
            applier.adopt,
            applier.release,
            applier.held,
            applier.apply_segment,
            applier.prepare_kept,
            applier.refuses,
            applier.refusal,
            applier.apply_kept,
        )
    },
}
_PR_SET_PDEATHSIG = 1
_PIPE_BYTES = 1 << 20  # Linux's default most for a process without privileges
_SHARED_PREFIX = "hybridflow-ingest-"
_SHARED_FROM = 64 * 1024  # answers' arrays of this many bytes or more go through a mapped file
_READ_LIMIT = 1 << 30  # what the answers' reader buffers before it pauses the pipe


class WorkerGone(RuntimeError):
    """The worker process ended before it answered."""


class Worker(Protocol):
    def blocks(self) -> Blocks:
        """Where a state it changes (:mod:`serving.online.applier`) keeps its arrays: blocks
        both this process and the worker map."""
        ...

    async def start(self) -> None: ...

    async def call(self, fn: Callable[..., T], *args: object) -> T: ...

    async def close(self) -> None: ...


class ThreadWorker:
    """The work in a thread of this process (``asyncio.to_thread``)."""

    def __init__(self) -> None:
        self._blocks = LocalBlocks()

    def blocks(self) -> Blocks:
        return self._blocks

    async def start(self) -> None:
        return None

    async def call(self, fn: Callable[..., T], *args: object) -> T:
        return await asyncio.to_thread(fn, *args)

    async def close(self) -> None:
        return None


class ProcessWorker:
    """The work in a worker process (started on the first call, or by :meth:`start`)."""

    def __init__(self, nice: int = 0, idle: bool = False) -> None:
        self._nice = nice  # added to the worker's niceness: requests first, ingestion after
        self._idle = idle  # SCHED_IDLE: only the CPU time nothing else of the box wants
        self._proc: asyncio.subprocess.Process | None = None
        self._turn = asyncio.Lock()

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def blocks(self) -> Blocks:
        return SharedBlocks()

    async def start(self) -> None:
        """Start the worker now (it imports pyarrow and numpy: about a second)."""
        async with self._turn:
            await self._started()

    async def call(self, fn: Callable[..., T], *args: object) -> T:
        name = fn.__name__
        if _CALLS.get(name) is not fn:
            raise ValueError(f"{fn!r} is not a call the worker takes")
        request = pickle.dumps((name, args), protocol=pickle.HIGHEST_PROTOCOL)
        async with self._turn:
            for attempt in (1, 2):
                proc = await self._started()
                try:
                    ok, value = await self._exchange(proc, request)
                    break
                except asyncio.CancelledError:  # its answer would be read as the next call's
                    proc.kill()
                    self._proc = None
                    raise
                except (WorkerGone, ConnectionError) as exc:
                    await self._reap(proc)
                    if attempt == 2:
                        raise WorkerGone(f"the ingest worker died twice running {name}") from exc
                    log.warning("the ingest worker died (%s); starting another", exc)
        if not ok:
            raise value
        return value

    async def close(self) -> None:
        async with self._turn:
            if self._proc is not None:
                await self._reap(self._proc, stop=True)

    async def _started(self) -> asyncio.subprocess.Process:
        if self._proc is None or self._proc.returncode is not None:
            remove_orphans(_shared_folder())
            remove_orphan_blocks()
            self._proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "serving.online.worker",
                str(self._nice),
                *(["idle"] if self._idle else []),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                env=_worker_env(),
                limit=_READ_LIMIT,
            )
            for fd in (0, 1):
                _widen_pipe(self._proc, fd)
            log.info("ingest worker started (pid %d)", self._proc.pid)
        return self._proc

    async def _exchange(self, proc: asyncio.subprocess.Process, request: bytes) -> tuple:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(_HEADER.pack(len(request)) + request)
        await proc.stdin.drain()
        try:
            size = _HEADER.unpack(await proc.stdout.readexactly(_HEADER.size))[0]
            envelope = await proc.stdout.readexactly(size)
        except asyncio.IncompleteReadError as exc:
            raise WorkerGone(f"the ingest worker (pid {proc.pid}) ended") from exc
        return opened(envelope)

    async def _reap(self, proc: asyncio.subprocess.Process, stop: bool = False) -> None:
        if stop and proc.returncode is None:
            assert proc.stdin is not None
            proc.stdin.close()  # the worker exits at the end of its input
            try:
                await asyncio.wait_for(proc.wait(), 5)
            except TimeoutError:
                proc.kill()
        elif proc.returncode is None:
            proc.kill()
        await proc.wait()
        if self._proc is proc:
            self._proc = None


def _widen_pipe(proc: asyncio.subprocess.Process, fd: int) -> None:
    """Let the worker's pipe ``fd`` (0: its input, 1: its output) hold :data:`_PIPE_BYTES`
    (Linux; with the default 64 KiB a large batch crosses in many turns of both processes); as
    it is where that is not allowed or the event loop does not show the pipe (uvloop)."""
    with contextlib.suppress(OSError, AttributeError):
        pipe = proc._transport.get_pipe_transport(fd).get_extra_info("pipe")  # type: ignore[attr-defined]
        fcntl.fcntl(pipe.fileno(), getattr(fcntl, "F_SETPIPE_SZ", 1031), _PIPE_BYTES)


def _worker_env() -> dict[str, str]:
    """This process's environment, with the folder that holds the ``serving`` package first on
    the worker's import path (however this process found it)."""
    home = str(Path(prepare.__file__).resolve().parents[2])
    path = os.environ.get("PYTHONPATH", "")
    return os.environ | {"PYTHONPATH": os.pathsep.join(p for p in (home, path) if p)}


# --- the worker process ---------------------------------------------------------------------


def _die_with_parent() -> None:
    """On Linux, have the kernel kill this process when its parent dies (a kill -9 of the
    endpoint leaves no worker behind)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _read_exactly(stream: Any, size: int) -> bytes | None:
    chunks, left = [], size
    while left:
        chunk = stream.read(left)
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def sealed(answer: object, shared: Path | None) -> bytes:
    """An answer as the envelope :func:`opened` reads: a pickle whose arrays (their buffers,
    pickle protocol 5) are in a file of ``shared`` (a folder in memory) when they are large,
    so the endpoint maps them instead of copying them through the pipe a few times; else
    inline."""
    buffers: list[pickle.PickleBuffer] = []
    meta = pickle.dumps(answer, protocol=5, buffer_callback=buffers.append)
    raws = [b.raw() for b in buffers]
    sizes = [r.nbytes for r in raws]
    if shared is not None and sum(sizes) >= _SHARED_FROM:
        try:
            fd, path = tempfile.mkstemp(prefix=f"{_SHARED_PREFIX}{os.getpid()}-", dir=shared)
            with os.fdopen(fd, "wb") as out:
                for raw in raws:
                    out.write(raw)
            return pickle.dumps((meta, sizes, path, None), protocol=5)
        except OSError:  # full or gone: inline
            with contextlib.suppress(OSError, UnboundLocalError):
                os.unlink(path)
    return pickle.dumps((meta, sizes, None, b"".join(raws)), protocol=5)


def opened(envelope: bytes) -> Any:
    """The answer in an envelope from :func:`sealed` (its arrays on the mapped file, which
    is removed at once: the mapping keeps it while they live; or on a copy of the inline
    bytes). Arrays come back writable."""
    meta, sizes, path, inline = pickle.loads(envelope)
    if path is not None:
        try:
            with open(path, "rb") as f:
                data: Any = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        finally:
            os.unlink(path)
    else:
        data = bytearray(inline)
    view, buffers, at = memoryview(data), [], 0
    for size in sizes:
        buffers.append(view[at : at + size])
        at += size
    return pickle.loads(meta, buffers=buffers)


def remove_orphans(shared: Path | None) -> None:
    """Remove the answer files of workers that are gone (a worker killed, or an endpoint
    killed, between an answer's file written and mapped)."""
    if shared is None:
        return
    for path in shared.glob(f"{_SHARED_PREFIX}*"):
        pid = path.name.removeprefix(_SHARED_PREFIX).split("-", 1)[0]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            with contextlib.suppress(OSError):
                path.unlink()


def _shared_folder() -> Path | None:
    """A folder in memory for answers (``/dev/shm`` where there is one)."""
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else None


def serve_calls(stdin: Any, stdout: Any) -> None:
    """Answer calls from ``stdin`` on ``stdout`` until ``stdin`` ends."""
    shared = _shared_folder()
    while (header := _read_exactly(stdin, _HEADER.size)) is not None:
        request = _read_exactly(stdin, _HEADER.unpack(header)[0])
        if request is None:
            return
        name, args = pickle.loads(request)
        try:
            answer: tuple[bool, object] = (True, _CALLS[name](*args))
        except Exception as exc:  # the caller raises it
            answer = (False, exc)
        try:
            data = sealed(answer, shared)
        except Exception as exc:  # an exception that does not pickle
            data = sealed((False, RuntimeError(f"{name}: {exc!r} ({answer[1]!r})")), None)
        stdout.write(_HEADER.pack(len(data)) + data)
        stdout.flush()


def _idle_policy() -> None:
    """Run under Linux's ``SCHED_IDLE`` (no privilege needed to lower one's own policy): the
    scheduler gives this process a core only when no other process wants it, and a process
    that wakes up (the endpoint's: a request's bytes arrived) takes the core from it at once
    (a niceness only lowers its share: a request can still wait behind it; docs/benchmarks.md,
    7 Dec 2026, measures both). Elsewhere: nothing."""
    if not hasattr(os, "SCHED_IDLE"):
        return
    tasks = Path("/proc/self/task")  # a policy is a thread's: those started at import too
    threads = [int(t) for t in os.listdir(tasks)] if tasks.is_dir() else [0]
    for thread in threads:
        with contextlib.suppress(OSError):
            os.sched_setscheduler(thread, os.SCHED_IDLE, os.sched_param(0))


def main() -> None:
    """``python -m serving.online.worker [NICE [idle]]``: answer the endpoint's calls,
    ``NICE`` added to this process's niceness, under ``SCHED_IDLE`` with ``idle``."""
    _die_with_parent()
    if os.getppid() == 1:  # the parent died before the line above
        return
    if len(sys.argv) > 1 and int(sys.argv[1]):
        with contextlib.suppress(OSError):
            os.nice(int(sys.argv[1]))
    if sys.argv[2:3] == ["idle"]:
        _idle_policy()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C stops the endpoint, which stops this
    serve_calls(sys.stdin.buffer, sys.stdout.buffer)


if __name__ == "__main__":
    main()
