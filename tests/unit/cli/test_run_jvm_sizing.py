"""``hybridflow run`` and ``hybridflow features`` size the JVM by the input they inspected,
before any flow runs, and start none when validate (and so every CPU stage after it) runs in
this process (the flows are replaced here: only the hand-over is under test); ``run`` loads
training's imports in the background only beside the JVM."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cli.main import build_parser
from infra.warm_imports import start_warm_imports


class FlowReached(Exception):
    """Raised in place of the flow: the CLI got past the JVM start."""


def _parquet(tmp_path, amounts):
    events = tmp_path / "events.parquet"
    t = dt.datetime(2025, 1, 1)
    pq.write_table(
        pa.table({"customer_id": ["a", "b", "c"], "event_time": [t] * 3, "amount": amounts}),
        events,
    )
    return events


def _csv(tmp_path, times):
    events = tmp_path / "events.csv"
    rows = "".join(f"c{i},{t},1.5\n" for i, t in enumerate(times))
    events.write_text("customer_id,event_time,amount\n" + rows)
    return events


INPUTS = {
    # native types: validated in this process, no JVM
    "parquet": (lambda tmp: _parquet(tmp, [1.0, 2.5, 3.0]), [], []),
    # text DuckDB parses as Spark does (numbers, ISO times): in this process too
    "parquet-text": (lambda tmp: _parquet(tmp, ["1.0", "2.5", "3"]), [], []),
    "csv": (lambda tmp: _csv(tmp, ["2025-01-01 10:00:00", "02/01/2025"]), [], []),
    # a pattern only Spark parses (12-hour clock): the JVM, sized by the file's estimate
    "csv-spark-pattern": (
        lambda tmp: _csv(tmp, ["01/02/2025 10:00 AM"]),
        ["--timestamp-format", "MM/dd/yyyy hh:mm a"],
        [1],
    ),
}


@pytest.mark.parametrize(
    ("command", "flow"),
    [("run", "flows.pipeline.pipeline_flow"), ("features", "flows.prepare.prepare_flow")],
)
@pytest.mark.parametrize("kind", list(INPUTS))
def test_the_jvm_starts_sized_by_the_inspected_input(tmp_path, monkeypatch, command, flow, kind):
    make, extra, jvm_started_for = INPUTS[kind]
    events = make(tmp_path)
    started: list[int | None] = []

    def start(settings, input_rows=None):
        started.append(input_rows)

    def reached(params):
        raise FlowReached

    registered: list[object] = []
    monkeypatch.setattr("infra.compute.spark.start_spark_in_background", start)
    monkeypatch.setattr("infra.startup.at_first_stage", registered.append)
    monkeypatch.setattr(flow, reached)
    args = build_parser().parse_args([command, "--events", str(events), *extra])
    with pytest.raises(FlowReached):
        args.handler(args)
    assert started == jvm_started_for
    warm = [start_warm_imports] if jvm_started_for and command == "run" else []
    assert registered == warm, "warm imports beside Spark stages only"
