"""The features stage on Spark as tasks that each run the feature SQL in DuckDB: what the task
per bucket (:mod:`tasks.engines.spark.features_per_bucket`) and the task per partition of events
shuffled by customer (:mod:`tasks.engines.spark.features_per_partition`) share.

A task holds every event of its customers, computes their features at every cutoff with DuckDB
(:class:`tasks.data.features_duckdb.InProcessFeatures`: the SQL of
:mod:`tasks.data.feature_sql`, the text Spark SQL and the in-process path run) and puts one
part file per output into the store, under the output's new data folder; it hands the driver
one :data:`PART_DONE` row per output. The driver publishes each output from those parts
(:class:`TaskPartsFrame`); nothing is visible until then, and a failed task's parts are swept
with the unpublished generation.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql.pandas.types import from_arrow_schema

from infra.compute.duckdb_session import memory_bounded
from infra.compute.spark_io import spark_schema_metadata
from infra.storage.datasets import DatasetManifest, new_data_prefix, publish_written_dataset
from infra.storage.store import ObjectStore
from tasks.data.cutoffs import Cutoff
from tasks.data.features_duckdb import InProcessFeatures
from tasks.engines.feature_frame import FeatureOutput

TASK_REMEDY = (
    "raise HYBRIDFLOW_IN_PROCESS_MEMORY, which bounds each features task's DuckDB too (unset: "
    "40% of the machine split between the tasks running on it)"
)
# What a task hands back to the driver per output of its share (a bucket or a partition).
PART_DONE_ARROW = pa.schema(
    [
        pa.field("bucket", pa.int64(), False),
        pa.field("output", pa.int64(), False),
        pa.field("rows", pa.int64(), False),
        pa.field("positives", pa.float64(), False),
        pa.field("events_after", pa.int64(), False),
        pa.field("schema", pa.binary(), False),
    ]
)
PART_DONE = from_arrow_schema(PART_DONE_ARROW)
# a task's targets: per output, its cutoffs and the store key of the task's part
Targets = Sequence[tuple[tuple[Cutoff, ...], str]]


@dataclass(frozen=True)
class PartWritten:
    """One output's part of one task: its rows, their label sum and the part's schema."""

    rows: int
    positives: float
    schema: pa.Schema


def part_key(data_prefix: str, part: int) -> str:
    """The store key of part ``part`` (a bucket, a partition) of an output under
    ``data_prefix``."""
    return f"{data_prefix}/part-{part:05d}.parquet"


def task_targets(
    outputs_cutoffs: Sequence[tuple[Cutoff, ...]], data_prefixes: Sequence[str], part: int
) -> list[tuple[tuple[Cutoff, ...], str]]:
    """Each output's cutoffs with the key of part ``part`` under its data folder."""
    return [
        (cutoffs, part_key(prefix, part))
        for cutoffs, prefix in zip(outputs_cutoffs, data_prefixes, strict=True)
    ]


def write_feature_parts(
    store: ObjectStore,
    events: pa.RecordBatchReader | Sequence[Path],
    available: set[str],
    targets: Targets,
    *,
    threads: int = 1,
    memory: str | None = None,
    sequence_length: int = 0,
) -> tuple[list[PartWritten], int]:
    """Compute the features of the customers in ``events`` (all of their events: Parquet files
    or a stream of record batches) at each target's cutoffs (one unlabelled cutoff, or labelled
    origins: training examples) with DuckDB and put each as a Parquet file at the target's key.
    Returns each target's part and the events after the latest cutoff."""
    cutoffs = list({c.name: c for cs, _ in targets for c in cs}.values())
    parts = []
    with (
        memory_bounded("a features task", memory, TASK_REMEDY),
        InProcessFeatures(
            events,
            cutoffs,
            available,
            threads=threads,
            memory=memory,
            sequence_length=sequence_length,
        ) as table,
    ):
        for target, key in targets:
            rows = table.output_table(target)
            sink = pa.BufferOutputStream()
            pq.write_table(rows, sink)
            store.put_bytes(key, sink.getvalue().to_pybytes())
            positives = (
                float(pc.sum(rows["label"]).as_py() or 0.0)
                if target[0].label_until is not None
                else 0.0
            )
            parts.append(PartWritten(rows.num_rows, positives, rows.schema))
        after = table.events_after()
    return parts, after


def parts_done(part: int, parts: Sequence[PartWritten], after: int) -> pa.RecordBatch:
    """What a task hands the driver: a row per output of part ``part``."""
    return pa.RecordBatch.from_pylist(
        [
            {
                "bucket": part,
                "output": i,
                "rows": written.rows,
                "positives": written.positives,
                "events_after": after,
                "schema": written.schema.serialize().to_pybytes(),
            }
            for i, written in enumerate(parts)
        ],
        schema=PART_DONE_ARROW,
    )


@dataclass
class _Published:
    data_prefix: str
    keys: list[str]
    rows: int
    positives: float
    schema: pa.Schema | None


class TaskPartsFrame(ABC):
    """A :class:`tasks.engines.feature_frame.FeatureFrame` whose outputs are written as parts by
    Spark tasks when the ``with`` block is entered (:meth:`_run`, a subclass's job) and
    published by :meth:`publish`."""

    def __init__(self, store: ObjectStore, outputs: list[FeatureOutput]) -> None:
        self._store = store
        self._outputs = outputs
        self._parts: dict[FeatureOutput, _Published] = {}
        self._events_after = 0
        self.spark_jobs: int | None = None

    @abstractmethod
    def _run(self, data_prefixes: list[str]) -> list[dict]:
        """The job writing every output's parts under ``data_prefixes`` (one per output, in
        order); what the tasks handed back (:data:`PART_DONE` rows)."""

    def __enter__(self) -> TaskPartsFrame:
        published = [_Published(new_data_prefix(o.prefix), [], 0, 0.0, None) for o in self._outputs]
        done = self._run([p.data_prefix for p in published])
        for row in sorted(done, key=lambda r: (r["output"], r["bucket"])):
            out = published[row["output"]]
            out.keys.append(part_key(out.data_prefix, row["bucket"]))
            out.rows += row["rows"]
            out.positives += row["positives"]
            out.schema = out.schema or pa.ipc.read_schema(pa.py_buffer(row["schema"]))
        # every output's row of a part carries the part's count: take the first output's
        self._events_after = sum(row["events_after"] for row in done if row["output"] == 0)
        self._parts = dict(zip(self._outputs, published, strict=True))
        return self

    def __exit__(self, *exc: object) -> None:
        self._parts = {}

    def publish(self, output: FeatureOutput) -> tuple[DatasetManifest, float]:
        """Publish the output's parts as its dataset; with its label rate (0.0 when
        unlabelled)."""
        if output not in self._parts:
            raise RuntimeError(f"no parts for {output.prefix}: use the frame inside its block")
        part = self._parts[output]
        manifest = publish_written_dataset(
            self._store,
            output.prefix,
            part.data_prefix,
            part.keys,
            rows=part.rows,
            metadata={
                **(spark_schema_metadata(part.schema) if part.schema is not None else {}),
                **output.metadata(),
            },
        )
        rate = part.positives / part.rows if part.rows and output.labelled else 0.0
        return manifest, rate

    def events_after(self) -> int:
        """Events after the latest cutoff, summed over the parts."""
        return self._events_after
