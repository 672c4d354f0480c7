"""Progress of long stages: a Prefect progress artifact plus log lines with the amount done.

:class:`ProgressReporter` is plain and reusable (rows scored, epochs trained, files written):
call :meth:`~ProgressReporter.update` with the amount done so far, from any thread. Inside a
Prefect flow or task run it keeps one progress artifact up to date; outside one it only logs.

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
import re
import threading
import time
from types import TracebackType
from typing import TYPE_CHECKING, Any
from uuid import UUID

if TYPE_CHECKING:
    from pyspark import Accumulator
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)


def _run_ids() -> dict[str, Any]:
    """The current Prefect flow/task run ids, or {} outside a run (or without Prefect)."""
    try:
        from prefect.context import FlowRunContext, TaskRunContext
    except ImportError:
        return {}
    ids: dict[str, Any] = {}
    flow_ctx = FlowRunContext.get()
    if flow_ctx is not None and flow_ctx.flow_run is not None:
        ids["flow_run_id"] = flow_ctx.flow_run.id
    task_ctx = TaskRunContext.get()
    if task_ctx is not None:
        ids["task_run_id"] = task_ctx.task_run.id
    return ids


class ProgressReporter:
    """Amount done of ``total``: a Prefect progress artifact (in a run) and throttled log lines.

    Thread-safe. ``min_interval_s`` throttles log lines and artifact updates; the first and the
    final update always go out. Failures to reach the Prefect API are logged, never raised:
    progress is a side channel and must not fail the stage.
    """

    def __init__(
        self,
        name: str,
        total: int | None,
        *,
        unit: str = "rows",
        min_interval_s: float = 5.0,
        logger: logging.Logger | None = None,
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
        self._run_ids = _run_ids()
        self._artifact_id: UUID | None = None
        self._artifact_failed = False
        if self._run_ids:
            self._artifact_id = self._create_artifact()

    @property
    def artifact_key(self) -> str:
        """Key of the progress artifact (Prefect keys: lower-case letters, digits, dashes)."""
        return "progress-" + re.sub(r"[^a-z0-9-]+", "-", self.name.lower()).strip("-")

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
            extra=self._run_ids,
        )
        if self._artifact_id is not None and not self._artifact_failed:
            try:
                from prefect.artifacts import update_progress_artifact

                update_progress_artifact(
                    artifact_id=self._artifact_id,
                    progress=self.percent,
                    description=self._description(),
                )
            except Exception as exc:  # noqa: BLE001 - progress must never fail the stage
                self._artifact_failed = True
                self._log.warning("progress artifact %s not updated: %s", self.artifact_key, exc)

    def _description(self) -> str:
        total = f" of {self.total:,}" if self.total else ""
        return f"{self.name}: {self.done:,}{total} {self.unit}"

    def _create_artifact(self) -> UUID | None:
        try:
            from prefect.artifacts import create_progress_artifact

            return create_progress_artifact(
                progress=0.0, key=self.artifact_key, description=self._description()
            )
        except Exception as exc:  # noqa: BLE001 - progress must never fail the stage
            self._log.warning("progress artifact %s not created: %s", self.artifact_key, exc)
            return None


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
