"""The features computed by DuckDB in this process, for event sets that fit one machine
comfortably (a Spark job costs more than their rows).

The SQL is :mod:`tasks.data.feature_sql`'s, the text Spark runs too; only the prepared input is
DuckDB's own. Event times are compared as integer microseconds, as in Spark, so a feature is
the same number in both engines (``tests/unit/tasks/data/test_features_duckdb.py`` checks them
against each other).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa

from infra.compute.duckdb_session import duckdb_connection, parquet_files_sql
from tasks.data.cutoffs import Cutoff
from tasks.data.feature_sql import SequenceSql, cutoff_sql, examples_sql, wide_sql
from tasks.data.sequences import pad_sequences
from tasks.definitions.feature_specs import MIX_COLUMNS, present_mix_columns

EVENT_COLUMNS = ("customer_id", "event_time", "amount", "event_type", "quantity", *MIX_COLUMNS)


class InProcessFeatures:
    """The wide per-customer table of ``cutoffs`` over ``events`` (an Arrow table or stream, or
    Parquet files DuckDB reads itself, with the contract's columns), from which each cutoff's
    features are selected; :meth:`close` it. With ``sequence_length`` N > 0 every output also
    has each customer's last N events before its cutoff (:mod:`tasks.data.sequences`).
    ``threads`` and ``memory`` bound DuckDB (default: every core, the ``in_process_memory``
    setting). DuckDB keeps the events in its own memory-bounded storage (see
    :mod:`infra.compute.duckdb_session`), so they are read once and never held in Arrow."""

    def __init__(
        self,
        events: pa.Table | pa.RecordBatchReader | Sequence[Path],
        cutoffs: Sequence[Cutoff],
        available_columns: set[str],
        *,
        threads: int | None = None,
        memory: str | None = None,
        sequence_length: int = 0,
    ) -> None:
        self.available_columns = set(available_columns)
        self.sequence_length = sequence_length
        self._mixes = present_mix_columns(self.available_columns)
        sequences = SequenceSql(sequence_length, "duckdb") if sequence_length else None
        wide = wide_sql(
            "prepared", cutoffs, self._mixes, sequences
        )  # refuses bad cutoffs before DuckDB opens
        self._con = duckdb_connection(threads=threads, memory=memory)
        if isinstance(events, (pa.Table, pa.RecordBatchReader)):
            self._con.register("events_input", events)
            self._con.execute(f"CREATE TEMP TABLE prepared AS {prepared_sql('events_input')}")
            self._con.unregister("events_input")
        else:
            prepared = prepared_sql(parquet_files_sql(events))
            self._con.execute(f"CREATE TEMP TABLE prepared AS {prepared}")
        self._con.execute(f"CREATE TEMP TABLE wide AS {wide}")
        self._con.execute("DROP TABLE prepared")

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
        """Free DuckDB's copy of the wide table."""
        self._con.close()

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
