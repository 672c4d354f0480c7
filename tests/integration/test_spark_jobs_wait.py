"""A failed Spark job's other tasks run on after the driver sees the failure: a caller that
cleans up what tasks write waits for them first (:meth:`infra.compute.spark_io.SparkJobs.wait_for_tasks`)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from infra.compute.spark_io import SparkJobs

pytestmark = pytest.mark.integration


def test_what_a_failed_jobs_running_task_writes_lands_before_the_wait_returns(spark, tmp_path):
    go, done = str(tmp_path / "go"), str(tmp_path / "done")

    def tasks(batches):
        for batch in batches:
            for value in batch.column(0).to_pylist():
                if value == 0:
                    raise ValueError("the first task fails at once")
                deadline = time.monotonic() + 30
                while not Path(go).exists() and time.monotonic() < deadline:
                    time.sleep(0.01)  # running on after its job failed, until the test says go
                Path(done).write_text("written")
                yield batch

    frame = spark.range(0, 2, 1, numPartitions=2)
    with SparkJobs(spark) as jobs:
        with pytest.raises(Exception, match="the first task fails at once"):
            frame.mapInArrow(tasks, frame.schema).collect()
        assert not Path(done).exists()
        Path(go).write_text("go")
        jobs.wait_for_tasks()
        assert Path(done).read_text() == "written"
