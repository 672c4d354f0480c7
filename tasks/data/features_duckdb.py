"""The features computed by DuckDB in this process, for event sets that fit one machine
comfortably (a Spark job costs more than their rows).

The SQL is :mod:`tasks.data.feature_sql`'s, the text Spark runs too; only the prepared input is
DuckDB's own. Event times are compared as integer microseconds, as in Spark, so a feature is
the same number in both engines (``tests/unit/tasks/data/test_features_duckdb.py`` checks them
against each other).
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from infra.compute.duckdb_session import (
    duckdb_connection,
    parquet_files_sql,
    scratch_dir,
    sql_string,
)
from tasks.data.cutoffs import Cutoff
from tasks.data.feature_sql import SequenceSql, cutoff_sql, examples_sql, wide_sql
from tasks.data.sequences import pad_sequences
from tasks.definitions.feature_specs import MIX_COLUMNS, present_mix_columns

EVENTS_PER_PASS = 6_000_000
"""Events whose aggregates one pass holds: at 30M events (2M customers) five passes, each with
its share of the events (~90 bytes each in DuckDB) and of the customers' aggregate states
(~1.2 KB each) in memory, where one pass held 6.8 GB; 4.3M events stay one pass."""

EVENT_COLUMNS = ("customer_id", "event_time", "amount", "event_type", "quantity", *MIX_COLUMNS)


class InProcessFeatures:
    """The wide per-customer table of ``cutoffs`` over ``events`` (an Arrow table or stream, or
    Parquet files DuckDB reads itself, with the contract's columns), from which each cutoff's
    features are selected; :meth:`close` it. With ``sequence_length`` N > 0 every output also
    has each customer's last N events before its cutoff (:mod:`tasks.data.sequences`).
    ``threads`` and ``memory`` bound DuckDB (default: every core, the ``in_process_memory``
    setting). DuckDB keeps the events in its own memory-bounded storage (see
    :mod:`infra.compute.duckdb_session`), so they are read once and never held in Arrow. The
    wide table goes to a Parquet file in a scratch folder of its own (compressed, and each output
    reads only its cutoff's columns), not to memory: at 2M customers its ~115 columns are 2.2 GB
    in DuckDB's memory. More events than ``events_per_pass`` (default :data:`EVENTS_PER_PASS`)
    are computed in passes over shares of the customers (:func:`feature_passes`), so the
    aggregates' memory is a share's; Parquet ``events`` whose files each hold every event of
    their customers (``customer_files``: the good events validated in process, a file per
    share of the customers) are those shares as they lie, a file or a few per pass
    (:func:`file_passes`), instead of being shared out again."""

    def __init__(
        self,
        events: pa.Table | pa.RecordBatchReader | Sequence[Path],
        cutoffs: Sequence[Cutoff],
        available_columns: set[str],
        *,
        threads: int | None = None,
        memory: str | None = None,
        sequence_length: int = 0,
        events_per_pass: int | None = None,
        customer_files: bool = False,
    ) -> None:
        self.available_columns = set(available_columns)
        self.sequence_length = sequence_length
        self._mixes = present_mix_columns(self.available_columns)
        sequences = SequenceSql(sequence_length, "duckdb") if sequence_length else None
        wide = wide_sql(
            "prepared", cutoffs, self._mixes, sequences
        )  # refuses bad cutoffs before DuckDB opens
        self._con = duckdb_connection(threads=threads, memory=memory)
        self._scratch = scratch_dir("features")
        try:
            if customer_files and not isinstance(events, (pa.Table, pa.RecordBatchReader)):
                self._build_by_files(events, wide, events_per_pass)
            else:
                self._build(events, wide, events_per_pass)
        except BaseException:
            self.close()
            raise

    def _build(
        self,
        events: pa.Table | pa.RecordBatchReader | Sequence[Path],
        wide: str,
        events_per_pass: int | None,
    ) -> None:
        """The wide table as Parquet files in the scratch folder, one per pass over a share of
        the customers (by a hash of the id), and the view ``wide`` over them."""
        con = self._con
        if isinstance(events, (pa.Table, pa.RecordBatchReader)):
            con.register("events_input", events)
            source = "events_input"
            rows = events.num_rows if isinstance(events, pa.Table) else 0
        else:
            source = parquet_files_sql(events)
            rows = int(con.execute(f"SELECT count(*) FROM {source}").fetchall()[0][0])
        passes = feature_passes(rows, events_per_pass)
        if passes == 1:  # DuckDB keeps the prepared events: every branch reads them
            con.execute(f"CREATE TEMP TABLE prepared AS {prepared_sql(source)}")
            self._write_wide(wide, 0)
            con.execute("DROP TABLE prepared")
        else:  # the events by share of customers, then one share at a time in memory
            shares = sql_string(str(self._scratch / "events"))
            con.execute(
                f"COPY (SELECT *, hash(customer_id) % {passes} AS _share "
                f"FROM ({prepared_sql(source)})) TO {shares} "
                "(FORMAT parquet, PARTITION_BY (_share))"
            )
            for share in range(passes):
                files = sql_string(str(self._scratch / "events" / f"_share={share}" / "*.parquet"))
                con.execute(
                    "CREATE TEMP TABLE prepared AS SELECT * FROM "
                    f"read_parquet({files}, hive_partitioning = false)"
                )
                self._write_wide(wide, share)
                con.execute("DROP TABLE prepared")
            shutil.rmtree(self._scratch / "events", ignore_errors=True)
        if source == "events_input":
            con.unregister("events_input")
        self._view_wide()

    def _build_by_files(
        self, files: Sequence[Path], wide: str, events_per_pass: int | None
    ) -> None:
        """The wide table as :meth:`_build` writes it, a pass per group of ``files`` (each file
        every event of its customers, :func:`file_passes`): no share of the events written."""
        rows = [pq.ParquetFile(path).metadata.num_rows for path in files]
        for part, group in enumerate(file_passes(list(files), rows, events_per_pass)):
            source = prepared_sql(parquet_files_sql(group))
            self._con.execute(f"CREATE TEMP TABLE prepared AS {source}")
            self._write_wide(wide, part)
            self._con.execute("DROP TABLE prepared")
        self._view_wide()

    def _view_wide(self) -> None:
        parts = sql_string(str(self._scratch / "wide-*.parquet"))
        self._con.execute(f"CREATE TEMP VIEW wide AS SELECT * FROM read_parquet({parts})")

    def _write_wide(self, wide: str, part: int) -> None:
        path = sql_string(str(self._scratch / f"wide-{part:05d}.parquet"))
        self._con.execute(f"COPY ({wide}) TO {path} (FORMAT parquet)")

    def cutoff_table(self, cutoff: Cutoff) -> pa.Table:
        """The customers seen at ``cutoff``: ``customer_id``, the features (doubles) and, for a
        labelled cutoff, ``label``; ordered by customer, so the output never depends on threads."""
        sql = cutoff_sql("wide", cutoff, self.available_columns, self.sequence_length > 0)
        return self._padded(self._con.sql(f"{sql} ORDER BY customer_id").to_arrow_table())

    def examples_table(self, origins: Sequence[Cutoff]) -> pa.Table:
        """The training examples at the labelled cutoffs ``origins``: at each, the customers seen
        by it (``customer_id``, features, ``label``) and its ``origin``; ordered by customer and
        origin, so the output never depends on threads."""
        sql = examples_sql("wide", origins, self.available_columns, self.sequence_length > 0)
        return self._padded(self._con.sql(f"{sql} ORDER BY customer_id, origin").to_arrow_table())

    def _padded(self, table: pa.Table) -> pa.Table:
        """``table`` with its sequence columns padded (unchanged without sequences)."""
        if not self.sequence_length:
            return table
        return pad_sequences(table, self.sequence_length, self._mixes)

    def output_table(self, cutoffs: Sequence[Cutoff]) -> pa.Table:
        """:meth:`examples_table` of labelled ``cutoffs``, else :meth:`cutoff_table` of the one."""
        if cutoffs and cutoffs[0].label_until is not None:
            return self.examples_table(cutoffs)
        if len(cutoffs) != 1:
            raise ValueError(f"unlabelled features are of one cutoff, got {len(cutoffs)}")
        return self.cutoff_table(cutoffs[0])

    def events_after(self) -> int:
        """Events after the latest cutoff (ignored by every feature)."""
        rows = self._con.execute("SELECT sum(events_after)::BIGINT FROM wide").fetchall()
        return int(rows[0][0] or 0)

    def close(self) -> None:
        """Close DuckDB and remove the wide table's file."""
        self._con.close()
        shutil.rmtree(self._scratch, ignore_errors=True)

    def __enter__(self) -> InProcessFeatures:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def prepared_sql(events: str) -> str:
    """The columns the aggregates use, from the relation ``events``: event time as integer
    microseconds (``_t``), a purchase flag (``_p``) and the quantity as a double (``_q``)."""
    mixes = "".join(f", {c}" for c in MIX_COLUMNS)
    return f"""SELECT customer_id, epoch_us(event_time) AS _t, event_type = 'purchase' AS _p,
    CAST(amount AS DOUBLE) AS amount, CAST(quantity AS DOUBLE) AS _q, event_type{mixes}
    FROM {events}"""


def file_passes(
    files: list[Path], rows: list[int], events_per_pass: int | None = None
) -> list[list[Path]]:
    """``files`` (of ``rows`` events each) in groups of consecutive files, one group per pass:
    a group takes the next file while its events stay within ``events_per_pass`` (default
    :data:`EVENTS_PER_PASS`); a larger file is a pass alone (the validate stage sizes its
    files by the same figure)."""
    per_pass = events_per_pass or EVENTS_PER_PASS
    groups: list[list[Path]] = []
    held = 0
    for path, n in zip(files, rows, strict=True):
        if groups and held + n <= per_pass:
            groups[-1].append(path)
            held += n
        else:
            groups.append([path])
            held = n
    return groups


def feature_passes(events: int, events_per_pass: int | None = None) -> int:
    """Passes over shares of the customers for ``events`` events (0: unknown, one pass)."""
    per_pass = events_per_pass or EVENTS_PER_PASS
    return max(1, math.ceil(events / per_pass))
