"""Child processes that do not outlive the process that started them, and a SIGTERM that ends
this process through its exit handlers.

A child started with :func:`die_with_parent` as its ``preexec_fn`` asks the kernel (Linux
``prctl(PR_SET_PDEATHSIG)``) for a signal when its parent dies, however it dies (``kill -9``
included): no uvicorn is left behind with ppid 1. The signal is tied to the *thread* that
started the child, so start such children from the main thread (or from a thread that lives as
long as they should). Elsewhere than Linux it is a no-op and the parent's exit handlers are the
only guard.

:func:`exit_on_sigterm` turns the first SIGTERM into ``SystemExit(143)`` in the main thread, so
a terminated ``hybridflow`` unwinds like an interrupted one: the flow run is marked, the exit
handlers stop the temporary Prefect API and Spark, and the exit code says what happened.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType

PR_SET_PDEATHSIG = 1
EXIT_TERMINATED = 128 + signal.SIGTERM


def die_with_parent(signum: int = signal.SIGTERM) -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child receive ``signum`` when this process dies (None
    where the kernel offers no such thing). A parent that died before the child set it up
    gets the signal sent at once."""
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    parent = os.getpid()

    def preexec() -> None:  # runs in the child between fork and exec: no locks, no logging
        libc.prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the request took effect
            os.kill(os.getpid(), signum)

    return preexec


def exit_on_sigterm() -> None:
    """From now on the first SIGTERM raises ``SystemExit(143)`` in the main thread; a second
    one while the exit handlers run is ignored (SIGKILL still ends the process, and its
    children follow through :func:`die_with_parent`)."""
    if threading.current_thread() is not threading.main_thread():
        return

    def terminated(signum: int, frame: FrameType | None) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise SystemExit(EXIT_TERMINATED)

    signal.signal(signal.SIGTERM, terminated)
