"""``hybridflow run`` and ``hybridflow features`` size the JVM by the input they inspected,
before any flow runs, and start none when validate (and so every CPU stage after it) runs in
this process (the flows are replaced here: only the hand-over is under test)."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cli.main import build_parser


class FlowReached(Exception):
    """Raised in place of the flow: the CLI got past the JVM start."""


@pytest.mark.parametrize(
    ("command", "flow"),
    [("run", "flows.pipeline.pipeline_flow"), ("features", "flows.prepare.prepare_flow")],
)
@pytest.mark.parametrize(
    ("amounts", "jvm_started_for"),
    [
        (["1.0", "2.5", "3"], [3]),  # text that Spark parses: the rows the footer holds
        ([1.0, 2.5, 3.0], []),  # native types: validated in this process, no JVM
    ],
    ids=["spark-parses", "in-process"],
)
def test_the_jvm_starts_sized_by_the_inspected_input(
    tmp_path, monkeypatch, command, flow, amounts, jvm_started_for
):
    events = tmp_path / "events.parquet"
    t = dt.datetime(2025, 1, 1)
    pq.write_table(
        pa.table({"customer_id": ["a", "b", "c"], "event_time": [t] * 3, "amount": amounts}),
        events,
    )
    started: list[int | None] = []

    def start(settings, input_rows=None):
        started.append(input_rows)

    def reached(params):
        raise FlowReached

    monkeypatch.setattr("infra.spark.start_spark_in_background", start)
    monkeypatch.setattr(flow, reached)
    args = build_parser().parse_args([command, "--events", str(events)])
    with pytest.raises(FlowReached):
        args.handler(args)
    assert started == jvm_started_for
