"""Progress of long stages: throttled log lines with the amount done, and an optional sink.

:class:`ProgressReporter` is plain and reusable (rows scored, epochs trained, files written):
call :meth:`~ProgressReporter.update` with the amount done so far, from any thread. A
:class:`ProgressSink` receives each reported percentage too; the flows pass one that keeps a
Prefect progress artifact up to date (:class:`flows.artifacts.ProgressArtifact`).

:class:`SparkRowProgress` feeds a reporter from a Spark accumulator that Python workers add their
rows to; a daemon thread polls it while the driver waits for the Spark job (Spark merges a task's
accumulator updates when the task finishes, so progress moves per finished task). A Spark Connect
session has no accumulators: there the server's progress messages (tasks finished of the job's
tasks) drive the reporter, as that share of the total.

Example (training, one update per epoch)::

    with ProgressReporter("train", total=max_epochs, unit="epochs") as progress:
        for epoch in range(max_epochs):
            ...
            progress.update(epoch + 1)
"""

from __future__ import annotations

import contextvars
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
    """Feeds a :class:`ProgressReporter` while a Spark job runs: from an accumulator of rows done
    (classic sessions) or from finished tasks (Spark Connect).

    Use :attr:`rows` inside the Spark function (``rows.add(len(batch))``; None on Spark Connect)
    and run the action inside the ``with`` block.
    """

    def __init__(
        self, spark: SparkSession, reporter: ProgressReporter, poll_s: float = 1.0
    ) -> None:
        from infra.compute.spark_connect import is_connect

        self.reporter = reporter
        self.poll_s = poll_s
        self._spark = spark
        self._connect = is_connect(spark)
        self.rows: Accumulator[int] | None = (
            None if self._connect else spark.sparkContext.accumulator(0)
        )
        self._stop = threading.Event()
        # the poller runs in the caller's context (the flow run, the Prefect settings pointing
        # at its API): the reporter's sink publishes from this thread
        self._thread = threading.Thread(
            target=contextvars.copy_context().run,
            args=(self._poll,),
            name=f"progress-{reporter.name}",
            daemon=True,
        )

    def _poll(self) -> None:
        while not self._stop.wait(self.poll_s):
            if self.rows is not None:
                self.reporter.update(self.rows.value)

    def _on_connect_progress(
        self, stages: Any, inflight_tasks: int, operation_id: str | None, done: bool
    ) -> None:
        self.reporter.update(rows_from_tasks(self.reporter.total, stages or []))

    def __enter__(self) -> SparkRowProgress:
        if self._connect:
            self._spark.registerProgressHandler(self._on_connect_progress)
        else:
            self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._connect:
            self._spark.removeProgressHandler(self._on_connect_progress)
            if exc_type is None and self.reporter.total:
                self.reporter.update(self.reporter.total, force=True)
            return
        self._stop.set()
        self._thread.join(timeout=5 * self.poll_s + 5)
        if exc_type is None and self.rows is not None:
            self.reporter.update(self.rows.value, force=True)


def rows_from_tasks(total: int | None, stages: Any) -> int:
    """Rows done estimated from Spark Connect's stage progress: the finished share of the
    job's tasks, times the rows the job covers."""
    tasks = sum(s.num_tasks for s in stages)
    if not total or not tasks:
        return 0
    return int(total * sum(s.num_completed_tasks for s in stages) / tasks)


def spark_counter(spark: SparkSession) -> Accumulator[int] | None:
    """An accumulator Python workers can add to (None on Spark Connect, which has none)."""
    from infra.compute.spark_connect import is_connect

    return None if is_connect(spark) else spark.sparkContext.accumulator(0)
