"""Modules a later stage of this process needs, imported on a background thread while the
process waits on Spark (a Py4J call releases the GIL; a small input leaves the second core idle).

The train stage's fits import torch (1.3-1.5 s of CPU on a 2-core box); in a whole run that
happens after the Spark stages. The stage that needs it calls :func:`finish_warm_imports` first,
so that it never imports concurrently with the thread. (``torch._dynamo``, 1.2-1.9 s more, is
not imported: the training loop's optimiser on the CPU is its own, tasks.ml.adamw, and needs
none; a CUDA fit, which does, is large beside it.)

``hybridflow run`` starts the thread only when the run has Spark stages. With every stage in
this process (DuckDB, on all cores, handing back to Python often) the thread bought nothing and
cost twice: validate and features took as much longer as the imports overlapped them, and
``torch._dynamo`` (1.8 s of CPU with sympy) loaded even when no network was fitted (every fit
reused): a 64k-event run's CPU 8.8 -> 6.8 s (docs/benchmarks.md, issue 34).
"""

from __future__ import annotations

import importlib
import logging
import threading
from collections.abc import Sequence

log = logging.getLogger(__name__)

TRAINING_MODULES = ("torch",)
_thread: threading.Thread | None = None


def start_warm_imports(modules: Sequence[str] = TRAINING_MODULES) -> None:
    """Import ``modules`` on a daemon thread, once per process; failures are left to the stage
    that imports them for real."""
    global _thread
    if _thread is not None:
        return

    def warm() -> None:
        for name in modules:
            try:
                importlib.import_module(name)
            except Exception as exc:  # the real import reports it
                log.debug("warm import of %s failed: %s", name, exc)

    _thread = threading.Thread(target=warm, name="warm-imports", daemon=True)
    _thread.start()


def finish_warm_imports() -> None:
    """Wait for :func:`start_warm_imports`' thread, if one was started."""
    if _thread is not None:
        _thread.join()
