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

from infra.duckdb_session import duckdb_connection, parquet_files_sql
from tasks.data.cutoffs import Cutoff
from tasks.data.feature_sql import cutoff_sql, wide_sql
from tasks.definitions.feature_specs import MIX_COLUMNS, present_mix_columns

EVENT_COLUMNS = ("customer_id", "event_time", "amount", "event_type", "quantity", *MIX_COLUMNS)


class InProcessFeatures:
    """The wide per-customer table of ``cutoffs`` over ``events`` (an Arrow table or stream, or
    Parquet files DuckDB reads itself, with the contract's columns), from which each cutoff's
    features are selected; :meth:`close` it. ``threads`` and ``memory`` bound DuckDB (default:
    every core, the ``in_process_memory`` setting). DuckDB keeps the events in its own memory-bounded
    storage (see :mod:`infra.duckdb_session`), so they are read once and never held in Arrow."""

    def __init__(
        self,
        events: pa.Table | pa.RecordBatchReader | Sequence[Path],
        cutoffs: Sequence[Cutoff],
        available_columns: set[str],
        *,
        threads: int | None = None,
        memory: str | None = None,
    ) -> None:
        self.available_columns = set(available_columns)
        wide = wide_sql(
            "prepared", cutoffs, present_mix_columns(self.available_columns)
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
        query = f"{cutoff_sql('wide', cutoff, self.available_columns)} ORDER BY customer_id"
        return self._con.sql(query).to_arrow_table()

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
