"""ProgressReporter outside a Prefect run: throttled log lines with rows done, total, rate; Spark
Connect's task progress turned into rows."""

from __future__ import annotations

import logging

from infra.progress import ProgressReporter


def test_reporter_logs_throttled_progress_and_always_the_final_line(caplog):
    logger = logging.getLogger("test.progress")
    caplog.set_level(logging.INFO, logger="test.progress")
    with ProgressReporter("scoring", total=1000, min_interval_s=3600, logger=logger) as progress:
        progress.update(10)  # first update goes out
        progress.update(500)  # throttled
        progress.update(400)  # never goes backwards
        assert progress.done == 500
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2
    assert messages[0].startswith("scoring: 10 rows done of 1,000 (1%)")
    assert messages[1].startswith("scoring: 500 rows done of 1,000 (50%)")


def test_reporter_without_total_and_other_units(caplog):
    logger = logging.getLogger("test.progress")
    caplog.set_level(logging.INFO, logger="test.progress")
    progress = ProgressReporter("Train model", total=None, unit="epochs", logger=logger)
    progress.update(3, force=True)
    assert progress.percent == 0.0
    assert "3 epochs done," in caplog.records[-1].getMessage()


def test_connect_progress_is_the_finished_share_of_the_jobs_tasks():
    from pyspark.sql.connect.shell.progress import StageInfo

    from infra.progress import rows_from_tasks

    stages = [
        StageInfo(stage_id=0, num_tasks=8, num_completed_tasks=6, num_bytes_read=0, done=False),
        StageInfo(stage_id=1, num_tasks=2, num_completed_tasks=0, num_bytes_read=0, done=False),
    ]
    assert rows_from_tasks(1000, stages) == 600
    assert rows_from_tasks(None, stages) == 0, "no total: nothing to scale"
    assert rows_from_tasks(1000, []) == 0, "no stages reported yet"


def test_the_spark_poller_reports_in_the_callers_context(spark):
    """Its sink publishes Prefect artifacts: it must see the caller's flow run and settings
    (a thread of its own would see no API and start another one)."""
    import contextvars
    import threading

    from infra.progress import ProgressReporter, SparkRowProgress

    flow_run = contextvars.ContextVar("flow_run", default=None)
    seen: list[object] = []

    class Sink:
        log_extra: dict = {}

        def __call__(self, percent: float, description: str) -> None:
            if threading.current_thread().name == "progress-probe":
                seen.append(flow_run.get())

    flow_run.set("run-42")
    reporter = ProgressReporter("probe", total=10, min_interval_s=0.0, sink=Sink())
    with SparkRowProgress(spark, reporter, poll_s=0.01) as progress:
        progress.rows.add(10)
        deadline = 200
        while not seen and deadline:
            progress._stop.wait(0.01)
            deadline -= 1
    assert seen and set(seen) == {"run-42"}, seen
