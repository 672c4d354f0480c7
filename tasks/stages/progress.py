"""Progress of long stages: throttled log lines with the amount done, and an optional sink.

:class:`ProgressReporter` is plain and reusable (rows scored, epochs trained, files written):
call :meth:`~ProgressReporter.update` with the amount done so far, from any thread. A
:class:`ProgressSink` receives each reported percentage too; the flows pass one that keeps a
Prefect progress artifact up to date (:class:`flows.artifacts.ProgressArtifact`).

:class:`SparkRowProgress` feeds a reporter from a Spark accumulator that Python workers add their
rows to; a daemon thread polls it while the driver waits for the Spark job (Spark merges a task's
accumulator updates when the task finishes, so progress moves per finished task).

Example (training, one update per epoch)::

    with ProgressReporter("train", total=max_epochs, unit="epochs") as progress:
        for epoch in range(max_epochs):
            ...
            progress.update(epoch + 1)
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from pyspark import Accumulator
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)


class ProgressSink(Protocol):
    """Where reported progress goes besides the log; must never raise."""

    log_extra: Mapping[str, Any]  # attributes for log lines written from other threads

    def __call__(self, percent: float, description: str) -> None: ...


class ProgressReporter:
    """Amount done of ``total``: throttled log lines and the ``sink``'s updates.

    Thread-safe. ``min_interval_s`` throttles log lines and sink updates; the first and the
    final update always go out.
    """

    def __init__(
        self,
        name: str,
        total: int | None,
        *,
        unit: str = "rows",
        min_interval_s: float = 5.0,
        logger: logging.Logger | None = None,
        sink: ProgressSink | None = None,
    ) -> None:
        self.name = name
        self.total = total if total and total > 0 else None
        self.unit = unit
        self.min_interval_s = min_interval_s
        self.done = 0
        self._log = logger or log
        self._lock = threading.Lock()
        self._started = time.perf_counter()
        self._last_emit = float("-inf")
        self._sink = sink
        self._log_extra = dict(sink.log_extra) if sink is not None else {}

    @property
    def percent(self) -> float:
        """Percent done (0 when the total is unknown)."""
        if not self.total:
            return 0.0
        return min(100.0, 100.0 * self.done / self.total)

    def update(self, done: int, *, force: bool = False) -> None:
        """Record ``done`` (cumulative) and report it if the interval has passed."""
        with self._lock:
            self.done = max(self.done, int(done))
            now = time.perf_counter()
            if not force and now - self._last_emit < self.min_interval_s:
                return
            self._last_emit = now
            self._emit(now - self._started)

    def finish(self) -> None:
        """Report the final amount (100% when it reached the total)."""
        self.update(self.done, force=True)

    def __enter__(self) -> ProgressReporter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.finish()

    def _emit(self, elapsed: float) -> None:
        rate = self.done / elapsed if elapsed > 0 else 0.0
        of_total = f" of {self.total:,} ({self.percent:.0f}%)" if self.total else ""
        self._log.info(
            "%s: %s %s done%s, %.1fs, %s %s/s",
            self.name,
            f"{self.done:,}",
            self.unit,
            of_total,
            elapsed,
            f"{rate:,.0f}",
            self.unit,
            extra=self._log_extra,
        )
        if self._sink is not None:
            self._sink(self.percent, self._description())

    def _description(self) -> str:
        total = f" of {self.total:,}" if self.total else ""
        return f"{self.name}: {self.done:,}{total} {self.unit}"


class SparkRowProgress:
    """Polls a Spark accumulator of rows done into a :class:`ProgressReporter` while a job runs.

    Use :attr:`rows` inside the Spark function (``rows.add(len(batch))``) and run the action
    inside the ``with`` block.
    """

    def __init__(
        self, spark: SparkSession, reporter: ProgressReporter, poll_s: float = 1.0
    ) -> None:
        self.reporter = reporter
        self.poll_s = poll_s
        self.rows: Accumulator[int] = spark.sparkContext.accumulator(0)
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._poll, name=f"progress-{reporter.name}", daemon=True
        )

    def _poll(self) -> None:
        while not self._stop.wait(self.poll_s):
            self.reporter.update(self.rows.value)

    def __enter__(self) -> SparkRowProgress:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join(timeout=5 * self.poll_s + 5)
        if exc_type is None:
            self.reporter.update(self.rows.value, force=True)
