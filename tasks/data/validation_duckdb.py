"""The events contract in DuckDB, for an input one process holds: the input conformed as Spark's
casts conform it (:mod:`tasks.data.validation`), then the rules of
:mod:`tasks.data.validation_sql` (the text Spark runs too), with the same results.

Only for columns whose Spark casts this reproduces exactly (:func:`in_process_type_problem`):
native Parquet types (timestamps to the microsecond, dates, whole numbers, doubles, booleans,
strings) and text parsed as Spark parses it (:mod:`tasks.data.text_values_duckdb`: a CSV's
values, string columns in Parquet), read from Parquet files or CSV files (DuckDB's CSV reader
with the dialect Spark's reader gets, :class:`tasks.data.input_formats.CsvDialect`).
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from infra.compute.duckdb_session import (
    csv_files_sql,
    duckdb_connection,
    parquet_files_sql,
    scratch_dir,
    sql_identifier,
    sql_string,
)
from tasks.data.input_formats import (
    CsvDialect,
    ParsedCounts,
    comma_grouped_sql,
    decimal_comma_sql,
)
from tasks.data.spark_text import java_double_string
from tasks.data.text_values_duckdb import (
    define_text_macros,
    parses_in_process,
    text_time_micros,
)
from tasks.data.validation_sql import (
    ROW_KEY,
    RowBounds,
    bad_rows_sql,
    contract_rules,
    deduplicated_from_sql,
    good_rows_sql,
    good_sql,
    quarantine_sql,
    shared_rows_sql,
)
from tasks.definitions.contract import (
    CONTRACT_COLUMNS,
    INTEGRAL_DECIMAL_ID,
    OPTIONAL_DEFAULTS,
    QUARANTINE_REASONS,
    REASON_DUPLICATE,
    WHOLE_DOUBLES,
    event_type_sql,
)

MICROS = 1_000_000
GOOD_EVENTS_SCHEMA = pa.schema(
    [
        ("customer_id", pa.string()),
        ("event_time", pa.timestamp("us", tz="UTC")),
        ("amount", pa.float64()),
        ("event_type", pa.string()),
        ("quantity", pa.int32()),
        ("category", pa.string()),
        ("channel", pa.string()),
    ]
)
"""The good events' columns, as Spark's validate writes them (in the contract's order)."""
FormatDetector = Callable[[list[str], ParsedCounts], str | None]
"""Chooses the ``event_time`` format from a sample of the texts, a tie by the whole column's
counts (:func:`tasks.data.input_formats.choose_timestamp_format`)."""
TIME_SAMPLES = 200  # event_time texts a detected format is chosen from (as Spark's sample)
TIME_UNITS = ("s", "ms", "us", "ns")  # nanoseconds (pandas' Parquet) floored to micros


def _whole(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) and t != pa.uint64()  # Spark reads uint64 as a decimal


def _text(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t)


def _time(t: pa.DataType) -> bool:
    return (pa.types.is_timestamp(t) and t.unit in TIME_UNITS) or pa.types.is_date32(t)


def _double(t: pa.DataType) -> bool:
    return pa.types.is_float64(t)


def _decimal(t: pa.DataType) -> bool:
    """A database's money type (``decimal(18,2)``) whose double and text both engines write
    alike: an unscaled value of at most 18 digits, at most 6 after the point."""
    return pa.types.is_decimal(t) and t.precision <= 18 and t.scale <= 6


def _flag(t: pa.DataType) -> bool:
    return pa.types.is_boolean(t)


IN_PROCESS_TYPES = {
    "customer_id": (_text, _whole, _double),
    "event_time": (_time, _text),
    "amount": (_double, _whole, _text, _decimal),
    "quantity": (_double, _whole, _text),
    "event_type": (_text, _whole, _flag),
    "category": (_text, _whole, _flag),
    "channel": (_text, _whole, _flag),
}


def value_type(t: pa.DataType) -> pa.DataType:
    """The type a column is validated as: a dictionary-encoded column as its values."""
    return t.value_type if pa.types.is_dictionary(t) else t


def in_process_type_problem(schema: pa.Schema, timestamp_format: str | None = None) -> str | None:
    """Why the in-process rules cannot validate columns of ``schema`` (contract names) with
    text times in ``timestamp_format`` (None: ISO-8601 or detected), or None."""
    times = schema.field("event_time").type if "event_time" in schema.names else pa.null()
    if _text(value_type(times)) and not parses_in_process(timestamp_format):
        return f"event_time pattern {timestamp_format!r} is parsed by Spark"
    for name in CONTRACT_COLUMNS:
        if name not in schema.names:
            continue
        t = value_type(schema.field(name).type)
        if not any(accepts(t) for accepts in IN_PROCESS_TYPES[name]):
            return f"column {name!r} has type {t}, parsed by Spark"
    return None


@dataclass(frozen=True)
class ValidationFigures:
    """What validation counted: kept rows, the kept events' time span (micros since the epoch),
    quarantined rows per reason."""

    rows_valid: int
    first_micros: int | None
    last_micros: int | None
    quarantined: dict[str, int]

    @property
    def rows_quarantined(self) -> int:
        return sum(self.quarantined.values())

    @staticmethod
    def total(parts: Sequence[ValidationFigures]) -> ValidationFigures:
        """The figures of the union of disjoint parts of the input."""
        firsts = [p.first_micros for p in parts if p.first_micros is not None]
        lasts = [p.last_micros for p in parts if p.last_micros is not None]
        quarantined: dict[str, int] = {}
        for part in parts:
            for reason, n in part.quarantined.items():
                quarantined[reason] = quarantined.get(reason, 0) + n
        return ValidationFigures(
            sum(p.rows_valid for p in parts),
            min(firsts) if firsts else None,
            max(lasts) if lasts else None,
            quarantined,
        )


EVENTS_PER_PASS = 6_000_000
"""Input rows one de-duplication pass holds: at 30M rows five passes (a share of the customers
each), where one pass held 8.2 GB of group-by and de-duplicated rows; 4.3M rows stay one pass."""


def validation_passes(rows: int, rows_per_pass: int | None = None) -> int:
    """Passes over shares of the customers for an input of about ``rows`` rows."""
    return max(1, math.ceil(rows / (rows_per_pass or EVENTS_PER_PASS)))


def _part(index: int) -> str:
    return f"part-{index:05d}.parquet"


class InProcessValidation:
    """Validated events, as Spark's validate writes them: the good events once each, and the
    quarantine. DuckDB reads the input (an Arrow table, or Parquet files read where they lie)
    and keeps only the de-duplicated rows; the outputs stream from them."""

    def __init__(
        self,
        source: str,
        schema: pa.Schema,
        sources: dict[str, str],
        *,
        tables: dict[str, pa.Table] | None = None,
        bounds: RowBounds | None = None,
        timestamp_format: str | None = None,
        detect_format: FormatDetector | None = None,
        passes: int = 1,
        decimal_comma: bool = False,
        purchase_event: str | None = None,
    ) -> None:
        """``source``: a DuckDB relation (SQL) over the input, which may name ``tables``;
        ``schema``: the input's Arrow types by contract name; ``sources``: the input's column
        behind each name (contract names, and the others, whose values tell rows apart); ``bounds``: the event times accepted (None: any). A text
        ``event_time`` is parsed with ``timestamp_format`` (a Spark pattern, an epoch name;
        None: ISO-8601), or the format ``detect_format`` chooses from a sample of the values
        when it is given. ``purchase_event``: an ``event_type`` value read as ``purchase``
        (:func:`~tasks.definitions.contract.event_type_sql`)."""
        self._purchase_event = purchase_event
        self._decimal_comma = decimal_comma  # text amounts: 12,50 (CsvDialect.decimal_comma)
        self._present = [c for c in CONTRACT_COLUMNS if c in schema.names]
        self._types = {c: value_type(schema.field(c).type) for c in self._present}
        self._con = duckdb_connection()
        for name, table in (tables or {}).items():
            self._con.register(name, table)
        self._define_sql_functions()
        self.timestamp_format = timestamp_format
        if detect_format is not None and _text(self._types.get("event_time", pa.null())):
            time_column = sql_identifier(sources["event_time"])
            self.timestamp_format = detect_format(
                self._time_samples(source, time_column),
                partial(self._parsed_counts, source, time_column),
            )
        columns = ", ".join(
            f"{self._micros(c, sql_identifier(sources[c]))} AS {c}" for c in self._present
        )
        text_time = _text(self._types.get("event_time", pa.null()))
        if text_time:  # parsed above; the quarantine keeps the text as it was
            columns += f", {sql_identifier(sources['event_time'])} AS event_time_text"
        others = [sql_identifier(n) for c, n in sources.items() if c not in CONTRACT_COLUMNS]
        row_key = f"hash({', '.join(others)})" if others else "CAST(NULL AS UBIGINT)"
        columns += f", {row_key} AS {ROW_KEY}"
        self._con.execute(f"CREATE TEMP VIEW input_events AS SELECT {columns} FROM {source}")
        typed = ", ".join(f"{self._typed(c)} AS {c}" for c in CONTRACT_COLUMNS)
        src = "".join(
            f", {'event_time_text' if c == 'event_time' and text_time else c} AS src_{c}"
            for c in self._present
        )
        self._con.execute(
            f"CREATE TEMP VIEW conformed_events AS SELECT {typed}{src}, {ROW_KEY} FROM input_events"
        )
        self._rules = contract_rules(bounds)
        self.passes = max(1, passes)
        if self.passes == 1:
            self._deduplicate("conformed_events")

    def _deduplicate(self, conformed: str) -> None:
        """The view ``deduplicated`` (:func:`tasks.data.validation_sql.deduplicated_sql`'s
        rows) over two tables: the good rows grouped, and the bad rows."""
        good = good_rows_sql(conformed, self._present, self._rules)
        bad = bad_rows_sql(conformed, self._present, self._rules)
        self._con.execute(f"CREATE TEMP TABLE deduplicated_good AS {good}")
        self._con.execute(f"CREATE TEMP TABLE deduplicated_bad AS {bad}")
        union = deduplicated_from_sql("deduplicated_good", "deduplicated_bad", self._present)
        self._con.execute(f"CREATE TEMP VIEW deduplicated AS {union}")

    def _drop_deduplicated(self) -> None:
        self._con.execute("DROP VIEW deduplicated")
        self._con.execute("DROP TABLE deduplicated_good")
        self._con.execute("DROP TABLE deduplicated_bad")

    def write_outputs(self, good_dir: Path, quarantine_dir: Path) -> ValidationFigures:
        """The good events and the quarantine written as Parquet files into the two folders,
        with the figures: in one pass (``part-00000.parquet``), or with ``passes`` > 1 a share
        of the customers at a time (by a hash of the id; a file per share in each folder), so
        that only a share's de-duplicated rows are ever held. Rows of one customer are in one
        share, so an exact duplicate always meets its copies. The shares are written conformed,
        a good row without its input values (:func:`~tasks.data.validation_sql.shared_rows_sql`:
        the conformed rows carry both, and writing them was half of validate's time at 30M)."""
        if self.passes == 1:
            self.write_good(good_dir / _part(0))
            self.write_quarantine(quarantine_dir / _part(0))
            return self.figures()
        scratch = scratch_dir("validate")
        try:
            shares = sql_string(str(scratch))
            rows = shared_rows_sql("conformed_events", self._present, self.passes, self._rules)
            self._con.execute(f"COPY ({rows}) TO {shares} (FORMAT parquet, PARTITION_BY (_share))")
            figures = []
            for share in range(self.passes):
                files = scratch / f"_share={share}"
                if files.is_dir():
                    pattern = sql_string(str(files / "*.parquet"))
                    source = f"read_parquet({pattern}, hive_partitioning = false)"
                else:  # no row of the input fell in this share
                    source = "(SELECT * FROM conformed_events LIMIT 0)"
                self._con.execute(
                    f"CREATE OR REPLACE TEMP VIEW conformed_share AS SELECT * FROM {source}"
                )
                self._deduplicate("conformed_share")
                figures.append(self.figures())
                self.write_good(good_dir / _part(share))
                self.write_quarantine(quarantine_dir / _part(share))
                self._drop_deduplicated()
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        return ValidationFigures.total(figures)

    @classmethod
    def of_parquet(
        cls,
        files: Sequence[Path],
        schema: pa.Schema,
        sources: dict[str, str],
        bounds: RowBounds | None = None,
        timestamp_format: str | None = None,
        detect_format: FormatDetector | None = None,
        passes: int = 1,
        purchase_event: str | None = None,
    ) -> InProcessValidation:
        """Over Parquet ``files`` of one schema (Arrow types by contract name)."""
        return cls(
            parquet_files_sql(files),
            schema,
            sources,
            bounds=bounds,
            timestamp_format=timestamp_format,
            detect_format=detect_format,
            passes=passes,
            purchase_event=purchase_event,
        )

    @classmethod
    def of_csv(
        cls,
        files: Sequence[Path],
        dialect: CsvDialect,
        columns: Sequence[str],
        timestamp_format: str | None = None,
        detect_format: FormatDetector | None = None,
        bounds: RowBounds | None = None,
        passes: int = 1,
        purchase_event: str | None = None,
    ) -> InProcessValidation:
        """Over CSV ``files`` of one header whose columns get the contract names ``columns``
        (every value text, read as Spark's CSV reader reads them: ``dialect``; a short row's
        missing values null, a long row's extra values dropped)."""
        names = [f"column_{i}" for i in range(len(columns))]
        schema = pa.schema([(c, pa.string()) for c in columns if c in CONTRACT_COLUMNS])
        sources = dict(zip(columns, names, strict=True))
        return cls(
            csv_files_sql(files, dialect, names),
            schema,
            sources,
            bounds=bounds,
            timestamp_format=timestamp_format,
            detect_format=detect_format,
            passes=passes,
            decimal_comma=dialect.decimal_comma,
            purchase_event=purchase_event,
        )

    @classmethod
    def of_table(cls, events: pa.Table, bounds: RowBounds | None = None) -> InProcessValidation:
        """Over an Arrow table with contract column names (other columns ignored)."""
        names = [c for c in CONTRACT_COLUMNS if c in events.column_names]
        table = pa.table({c: pc.cast(events[c], value_type(events[c].type)) for c in names})
        sources = {c: c for c in names}
        return cls(
            "arrow_input", table.schema, sources, tables={"arrow_input": table}, bounds=bounds
        )

    def close(self) -> None:
        self._con.close()

    def _time_samples(self, source: str, column: str) -> list[str]:
        """The first non-empty ``event_time`` texts (trimmed), to choose their format from."""
        text = f"trim({column}, ' ')"
        rows = self._con.execute(
            f"SELECT {text} FROM {source} WHERE coalesce({text}, '') <> '' LIMIT {TIME_SAMPLES}"
        ).fetchall()
        return [r[0] for r in rows]

    def _parsed_counts(
        self, source: str, column: str, formats: Sequence[str | None]
    ) -> dict[str | None, int]:
        """How many of the input's ``event_time`` texts each of ``formats`` parses (one pass)."""
        counts = ", ".join(f"count({text_time_micros(column, f)})" for f in formats)
        row = self._con.execute(f"SELECT {counts} FROM {source}").fetchone()
        assert row is not None  # an aggregate without grouping has one row
        return dict(zip(formats, (int(n) for n in row), strict=True))

    def _micros(self, name: str, column: str) -> str:
        """An input column as the validation reads it: times as micros since the epoch."""
        if name != "event_time":
            return column
        if _text(self._types[name]):
            return text_time_micros(column, self.timestamp_format)
        if pa.types.is_date32(self._types[name]):
            return f"epoch_us(CAST({column} AS TIMESTAMP))"
        return f"epoch_us({column})"

    def _define_sql_functions(self) -> None:
        """The functions the validation SQL calls, in DuckDB: Spark's text of doubles and
        timestamps, the input's values as Spark's text (by the input's type), Spark's
        ``explode`` and ``sequence``."""
        # a scalar function, not an Arrow one: DuckDB calls it once per vector that has a
        # selected row, and the few quarantined rows are spread over every vector of the input
        # (an Arrow call cost ~0.4 ms: 0.7 s at 4.3M rows; the scalar one is also faster when
        # every row is selected)
        self._con.create_function("double_text", java_double_string, ["DOUBLE"], "VARCHAR")
        define_text_macros(self._con.execute)
        macros = {
            "timestamp_text(t)": _timestamp_text("t"),
            "utc_timestamp(t)": "make_timestamptz(t)",
            "explode(x)": "unnest(x)",
            "sequence(a, b)": "generate_series(a, b)",
        }
        for c in self._present:
            macros[f"input_text_{c}(x)"] = self._input_text(c, "x")
        for signature, body in macros.items():
            self._con.execute(f"CREATE TEMP MACRO {signature} AS {body}")

    def _typed(self, name: str) -> str:
        """The contract's value of ``name`` (Spark's ``conform_events``)."""
        if name not in self._present:
            default = OPTIONAL_DEFAULTS[name]
            if name == "quantity":
                return f"CAST({default} AS INTEGER)"
            return "CAST(NULL AS VARCHAR)" if default is None else f"'{default}'"
        t = self._types[name]
        if name == "event_time":
            return name  # micros since the epoch (the input_events view)
        if name == "amount":
            if not _text(t):
                return f"CAST({name} AS DOUBLE)"
            if self._decimal_comma:
                return f"spark_double({decimal_comma_sql(name, 'regexp_matches')})"
            return f"spark_double({comma_grouped_sql(name, 'regexp_matches')})"
        if name == "quantity":
            value = f"spark_double({name})" if _text(t) else name
            whole = f"NOT isnan({value}) AND {value} = floor({value})"
            if not (_double(t) or _text(t)):
                whole = "TRUE"
            return f"CASE WHEN {whole} THEN TRY_CAST({value} AS INTEGER) END"
        text = name if _text(t) else f"CAST({name} AS VARCHAR)"
        if name == "customer_id":
            if _double(t):  # as Spark's customer_id_text: whole numbers as integers, NaN none
                text = (
                    f"CASE WHEN isnan({name}) THEN NULL WHEN abs({name}) < {WHOLE_DOUBLES} "
                    f"AND {name} = round({name}) THEN CAST(CAST({name} AS BIGINT) AS VARCHAR) "
                    f"ELSE double_text({name}) END"
                )
            pattern = INTEGRAL_DECIMAL_ID.replace("'", "''")
            trimmed = f"trim({text}, ' ')"
            # the pattern needs a '.': a cheap test keeps the regex off every other id
            return (
                f"CASE WHEN contains({trimmed}, '.') "
                f"THEN regexp_replace({trimmed}, '{pattern}', '\\1') ELSE {trimmed} END"
            )
        default = OPTIONAL_DEFAULTS[name]
        fallback = "NULL" if default is None else f"'{default}'"
        trimmed = f"trim({text}, ' ')"
        if name == "event_type":  # the contract's names for the synonyms logs use
            trimmed = event_type_sql(trimmed, self._purchase_event)
        return f"CASE WHEN coalesce({trimmed}, '') = '' THEN {fallback} ELSE {trimmed} END"

    def _input_text(self, name: str, value: str) -> str:
        """An input value of ``name`` as Spark's ``CAST(... AS STRING)`` writes it."""
        t = self._types[name]
        if name == "event_time" and not _text(t):
            return _date_text(value) if pa.types.is_date32(t) else _timestamp_text(value)
        if _double(t):
            return f"double_text({value})"
        return value if _text(t) else f"CAST({value} AS VARCHAR)"

    def _good_sql(self) -> str:
        return good_sql("deduplicated")

    def _quarantine_sql(self) -> str:
        return quarantine_sql("deduplicated", self._present)

    def good(self) -> pa.Table:
        """Every valid event once, contract columns, typed as Spark's validate writes them
        (:data:`GOOD_EVENTS_SCHEMA`)."""
        return self._con.sql(self._good_sql()).to_arrow_table().cast(GOOD_EVENTS_SCHEMA)

    def quarantine(self) -> pa.Table:
        """Rows that break a rule, as many times as they were read, with their input values;
        and each extra copy of a valid event (``duplicate_event``), with the kept values."""
        return self._con.sql(self._quarantine_sql()).to_arrow_table()

    def quarantine_schema(self) -> pa.Schema:
        """The quarantine's columns: the input's contract columns and the reason, as text."""
        return pa.schema([(c, pa.string()) for c in [*self._present, "reason"]])

    def write_good(self, path: Path) -> None:
        """:meth:`good` written to the Parquet file ``path`` (streamed: never all in memory)."""
        self._copy(self._good_sql(), path)

    def write_quarantine(self, path: Path) -> None:
        """:meth:`quarantine` written to the Parquet file ``path`` (streamed)."""
        self._copy(self._quarantine_sql(), path)

    def _copy(self, query: str, path: Path) -> None:
        self._con.execute(f"COPY ({query}) TO {sql_string(str(path))} (FORMAT parquet)")

    def figures(self) -> ValidationFigures:
        """Kept rows, their first and last event time, quarantined rows per reason."""
        by_reason = ", ".join(
            f"sum(copies) FILTER (WHERE reason = '{r}')" for r in QUARANTINE_REASONS
        )
        rows, first, last, duplicates, *counts = self._con.execute(
            f"""SELECT count(*) FILTER (WHERE reason IS NULL),
                min(event_time) FILTER (WHERE reason IS NULL),
                max(event_time) FILTER (WHERE reason IS NULL),
                sum(copies - 1) FILTER (WHERE reason IS NULL), {by_reason}
            FROM deduplicated"""
        ).fetchall()[0]
        quarantined = {r: int(n) for r, n in zip(QUARANTINE_REASONS, counts, strict=True) if n}
        if duplicates:
            quarantined[REASON_DUPLICATE] = int(duplicates)
        return ValidationFigures(int(rows), first, last, quarantined)


def _timestamp_text(micros: str) -> str:
    """SQL for Spark's text of a timestamp given as micros: seconds, then the fraction without
    trailing zeros."""
    fraction = f"(({micros} % {MICROS}) + {MICROS}) % {MICROS}"
    return (
        f"strftime(make_timestamp({micros}), '%Y-%m-%d %H:%M:%S') || "
        f"CASE WHEN {fraction} = 0 THEN '' "
        f"ELSE '.' || rtrim(lpad(CAST({fraction} AS VARCHAR), 6, '0'), '0') END"
    )


def _date_text(micros: str) -> str:
    return f"strftime(make_timestamp({micros}), '%Y-%m-%d')"
