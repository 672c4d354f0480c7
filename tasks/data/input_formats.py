"""Reading a user's event files: format, CSV delimiter, timestamp format and column mapping.

Everything here checks the input cheaply up front (file headers, Parquet footers) so that a bad
file is reported by name before Spark runs a job on it.
"""

from __future__ import annotations

import csv
import dataclasses
import datetime as dt
import gzip
import io
import logging
import re
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import BaseModel, Field

from infra.errors import HybridflowInputError
from tasks.data.timestamp_patterns import (
    EPOCH_MILLIS,
    EPOCH_SECONDS,
    check_timestamp_format,
)
from tasks.definitions.contract import (
    ALLOWED_TYPES,
    CONTRACT_COLUMNS,
    EPOCH_MILLIS_DIGITS,
    EPOCH_SECONDS_DIGITS,
    PURCHASE_EVENT_PATTERN,
    REQUIRED_COLUMNS,
    UNIT_PRICE_NAMES,
    column_map_hints,
    letters_only,
)

if TYPE_CHECKING:  # PySpark is imported where Spark reads the files: the CLI's checks need none
    from pyspark.sql import DataFrame, SparkSession

    from infra.settings import HybridflowSettings

log = logging.getLogger(__name__)

ParsedCounts = Callable[[Sequence[str | None]], dict[str | None, int]]
"""How many values of the input's whole ``event_time`` column each format parses."""

CSV_SUFFIXES = (".csv", ".txt", ".tsv", ".tab", ".csv.gz", ".txt.gz", ".tsv.gz", ".tab.gz")
"""Delimited text, read alike whatever the delimiter (detected from the header)."""
PARQUET_SUFFIXES = (".parquet", ".pq")
DELIMITERS = (",", ";", "\t", "|")
DEFAULT_QUOTE = '"'
HEADER_BYTES = 1 << 20
ISO_TIME = re.compile(
    r"^\d{4}-\d{1,2}-\d{1,2}([ T]\d{1,2}:\d{2}(:\d{2}(\.\d{1,9})?)?)?\s*(Z|UTC|[+-]\d{2}:?\d{2})?$"
)
# (strptime format to test samples with, the Spark datetime pattern that parses the same).
TIMESTAMP_CANDIDATES: tuple[tuple[str, str], ...] = tuple(
    (date_py + time_py, date_sp + time_sp)
    for date_py, date_sp in (
        ("%d/%m/%Y", "d/M/yyyy"),
        ("%m/%d/%Y", "M/d/yyyy"),
        ("%d.%m.%Y", "d.M.yyyy"),
        ("%d-%m-%Y", "d-M-yyyy"),
        ("%Y/%m/%d", "yyyy/M/d"),
    )
    for time_py, time_sp in (
        (" %H:%M:%S", " H:mm:ss"),
        (" %H:%M", " H:mm"),
        ("", ""),
    )
)
COMPACT_CANDIDATES: tuple[tuple[int, str, str], ...] = (
    (8, "%Y%m%d", "yyyyMMdd"),
    (12, "%Y%m%d%H%M", "yyyyMMddHHmm"),
    (14, "%Y%m%d%H%M%S", "yyyyMMddHHmmss"),
)
"""Dates written as one number (``19970101``: CDNOW, many database dumps): (its digits, the
strptime format, the Spark pattern). Only values of exactly that many digits count: strptime
would read ``1997011`` too, Spark does not. Epoch seconds have 9-10 digits and milliseconds
12-13: an 8-digit number is never taken for epoch seconds of 1970. 12 digits are both
``yyyyMMddHHmm`` and epoch milliseconds of 1973-2001: when every sample that fits the one fits
the other, the compact date wins (:func:`_dates_over_epochs`)."""
SAMPLE_ROWS = 200
DECIMAL_COMMA_NUMBER = r"[+-]?([0-9]{1,3}([.][0-9]{3})+|[0-9]+)(,[0-9]+)?"
"""A number with a decimal comma, dots grouping thousands or none (``12,50``, ``1.234,5``,
``7``): the values a decimal-comma amount column holds."""
POINT_DECIMAL = r"[+-]?[0-9]*[.][0-9]+([eE][+-]?[0-9]+)?"
"""A number with a decimal point (``12.50``, ``.5``, ``1.5e3``)."""
GROUPED_THOUSANDS = r"^[+-]?[0-9]{1,3}([.][0-9]{3})+(,[0-9]+)?$"
"""A decimal-comma number whose dots group thousands: the dots are dropped before the comma
becomes the decimal point. One pattern for Java's regex (Spark) and RE2 (DuckDB), written
without a backslash (``[.]``) so that it reads the same inside either engine's SQL string."""
COMMA_GROUPED_THOUSANDS = r"^[+-]?[0-9]{1,3}(,[0-9]{3})+([.][0-9]+)?$"
"""A number whose commas group thousands, with a decimal point or none (``1,234.50``,
``12,345``: spreadsheets' number format, quoted in CSV): the commas are dropped. Not read so
when the amounts use a decimal comma (:attr:`CsvDialect.decimal_comma`). Written for Java's
regex and RE2 alike, without a backslash."""
CSV_BYTES_PER_ROW = 48  # a typical event line; gzip shrinks text about 4x
GZIP_RATIO = 4


class InputOptions(BaseModel):
    """How to read the events: column mapping and CSV/timestamp formats (default: detected)."""

    column_map: dict[str, str] = Field(
        default_factory=dict, description="contract column -> the input's column (any case)"
    )
    csv_delimiter: str | None = Field(default=None, description="default: detected")
    csv_quote: str | None = Field(
        default=None, min_length=1, max_length=1, description='default: " (RFC 4180)'
    )
    csv_escape: str | None = Field(
        default=None,
        min_length=1,
        max_length=1,
        description="the character before a quote inside a quoted value; default: the quote "
        'itself (RFC 4180: "" is one quote), e.g. \\ for exports that write \\"',
    )
    timestamp_format: str | None = Field(
        default=None,
        description="Spark datetime pattern (e.g. 'dd/MM/yyyy HH:mm'), 'epoch_seconds' or "
        "'epoch_millis'; default: detected",
    )
    purchase_event: str | None = Field(
        default=None,
        pattern=PURCHASE_EVENT_PATTERN,
        description="the event_type value (any case) that is a purchase, e.g. 'checkout', "
        "besides 'purchase' and its synonyms (transaction, order, sale, buy)",
    )

    def merged_with(self, fallback: InputOptions) -> InputOptions:
        """These options, with ``fallback`` (e.g. settings) filling what is not given here."""
        return InputOptions(
            column_map=fallback.column_map | self.column_map,
            csv_delimiter=self.csv_delimiter or fallback.csv_delimiter,
            csv_quote=self.csv_quote or fallback.csv_quote,
            csv_escape=self.csv_escape or fallback.csv_escape,
            timestamp_format=self.timestamp_format or fallback.timestamp_format,
            purchase_event=self.purchase_event or fallback.purchase_event,
        )

    def csv_dialect(self, delimiter: str) -> CsvDialect:
        """How CSV files with ``delimiter`` are read (RFC 4180 unless told otherwise)."""
        quote = self.csv_quote or DEFAULT_QUOTE
        return CsvDialect(delimiter=delimiter, quote=quote, escape=self.csv_escape or quote)


@dataclass(frozen=True)
class CsvDialect:
    """How every CSV reader here splits a file into values: the Python pre-check, Spark's and
    DuckDB's readers get the same three characters. RFC 4180 by default: values may be quoted
    with ``"``, a quoted value may hold the delimiter and line breaks, and ``""`` inside it is
    one quote (``escape == quote``); another ``escape`` (e.g. ``\\``) escapes the quote instead."""

    delimiter: str = ","
    quote: str = '"'
    escape: str = '"'
    decimal_comma: bool = False
    """Amounts written with a decimal comma (``12,50``; ``1.234,50`` with dots grouping
    thousands), as ``;``-separated European exports write them: detected from the first rows
    (:func:`amounts_use_decimal_comma`), read by both engines as :func:`decimal_comma_sql` says."""

    def python_reader_args(self) -> dict[str, Any]:
        """Keyword arguments of :func:`csv.reader` that read as Spark and DuckDB do."""
        doubled = self.escape == self.quote
        return {
            "delimiter": self.delimiter,
            "quotechar": self.quote,
            "doublequote": doubled,
            "escapechar": None if doubled else self.escape,
        }

    def spark_options(self) -> dict[str, str]:
        """Spark's CSV reader options (``multiLine``: a quoted value may span lines)."""
        return {
            "sep": self.delimiter,
            "quote": self.quote,
            "escape": self.escape,
            "multiLine": "true",
        }


def input_defaults(settings: HybridflowSettings) -> InputOptions:
    """The settings' input options: what a run's own options fall back to."""
    return InputOptions(
        column_map=settings.column_map,
        csv_delimiter=settings.csv_delimiter,
        timestamp_format=settings.timestamp_format,
        csv_quote=settings.csv_quote,
        csv_escape=settings.csv_escape,
        purchase_event=settings.purchase_event,
    )


@dataclass(frozen=True)
class EventsInput:
    """What the files say before any engine reads them: from file names, CSV headers and
    Parquet footers only."""

    path: Path
    files: list[Path]
    format: str
    columns: list[str]
    """The contract names the input's columns get (``--map`` applied, lower-cased)."""
    rows_estimate: int
    """Exact for Parquet (footers), from the file sizes for CSV."""
    csv_delimiter: str | None = None
    csv_dialect: CsvDialect | None = None
    """For CSV: the delimiter (given or detected), quote and escape every reader uses."""
    arrow_schema: pa.Schema | None = None
    """Parquet files that all have this one schema (contract names), without Hive partition
    folders; else None."""
    source_columns: dict[str, str] | None = None
    """With ``arrow_schema``: the input's column behind each of its names."""
    nanosecond_columns: tuple[str, ...] = ()
    """Parquet columns (the input's names) of nanosecond timestamps, as pandas writes them:
    DuckDB reads them, Spark refuses such a file (:func:`refuse_nanoseconds_for_spark`)."""

    @property
    def rows_estimated(self) -> bool:
        """``rows_estimate`` is from the files' sizes (CSV), not counted."""
        return self.format == "csv"


@dataclass
class RawEvents:
    """The input as read: contract-named columns (other columns kept, lower-cased)."""

    df: DataFrame
    path: Path
    files: list[Path]
    format: str
    timestamp_format: str | None
    rows_estimate: int = 0
    """Rows in the input: exact for Parquet (footers), from the file sizes for CSV."""
    decimal_comma: bool = False
    """Amounts are text with a decimal comma (:attr:`CsvDialect.decimal_comma`)."""


def resolve_events_path(path: str | Path) -> Path:
    """The events path made absolute; a symbolic link loop is an input error."""
    try:
        return Path(path).expanduser().resolve()
    except (OSError, RuntimeError) as exc:
        raise HybridflowInputError(
            f"cannot resolve events path {path}: {_first_line(exc)}"
        ) from None


def list_event_files(path: Path) -> list[Path]:
    """The data files of a file or folder (hidden and ``_``-prefixed files skipped), sorted."""
    if not path.exists():
        raise HybridflowInputError(f"events path not found: {path}")
    if path.is_file():
        return [path]
    files = sorted(
        p
        for p in path.rglob("*")
        if p.is_file()
        and not any(part.startswith((".", "_")) for part in p.relative_to(path).parts)
    )
    if not files:
        raise HybridflowInputError(f"events path holds no data files: {path}")
    return files


def detect_format(files: list[Path], path: Path) -> str:
    """``parquet`` or ``csv`` from the file names."""
    names = [f.name.lower() for f in files]
    if all(n.endswith(PARQUET_SUFFIXES) for n in names):
        return "parquet"
    if all(n.endswith(CSV_SUFFIXES) for n in names):
        return "csv"
    odd = sorted({f.suffix.lower() or f.name for f in files})
    raise HybridflowInputError(
        f"cannot tell the format of {path}: expected only .parquet or only .csv (.txt, .tsv) "
        "files, "
        f"found {', '.join(odd)}"
    )


def _check_parquet_files(
    files: list[Path], path: Path
) -> tuple[int, list[str], pa.Schema | None, list[pa.Schema]]:
    """Total rows and the column names from the footers (every file's, in first-seen order,
    then Hive partition keys of the folders), the files' one schema when they agree and no
    folder is a partition, and each file's schema; a corrupt or non-Parquet file is named."""
    rows, names, schemas = 0, [], []
    for f in files:
        try:
            meta = pq.read_metadata(f)
        except Exception as exc:
            raise HybridflowInputError(
                f"cannot read Parquet file {f}: {_first_line(exc)}"
            ) from None
        rows += meta.num_rows
        schemas.append(meta.schema.to_arrow_schema())
        names += [n for n in schemas[-1].names if n not in names]
    partitioned = False
    for f in files:
        for part in f.relative_to(path).parts[:-1]:
            key, sep, _ = part.partition("=")
            partitioned = partitioned or bool(sep)
            if sep and key not in names:
                names.append(key)
    uniform = not partitioned and all(s.equals(schemas[0]) for s in schemas[1:])
    return rows, names, schemas[0].remove_metadata() if uniform else None, schemas


def _check_parquet_types(files: list[Path], schemas: list[pa.Schema], read: Sequence[str]) -> None:
    """The columns validation ``read`` (the input's names) have one type across the files:
    Spark reads every file with one file's schema and fails on another's type in the middle
    of a job. Only differences Spark reads through are let pass (text or dictionary encoding,
    a timestamp's unit or zone)."""
    wanted = {_norm(c) for c in read}
    seen: dict[str, tuple[Path, pa.DataType]] = {}
    for f, schema in zip(files, schemas, strict=True):
        for field in schema:
            name = _norm(field.name)
            if name not in wanted:
                continue
            kind = _spark_kind(field.type)
            first = seen.setdefault(name, (f, kind))
            if first[1] != kind:
                raise HybridflowInputError(
                    f"column {field.name!r} is {first[1]} in {first[0]} but {kind} in {f}: "
                    "all Parquet files of one input need the same type for each column"
                )


def _spark_kind(t: pa.DataType) -> pa.DataType:
    """The type as Spark tells types apart across files: dictionary encoding, large text and
    a timestamp's unit or zone do not count."""
    if pa.types.is_dictionary(t):
        t = t.value_type
    if pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return pa.string()
    if pa.types.is_large_binary(t):
        return pa.binary()
    if pa.types.is_timestamp(t):
        return pa.timestamp("us")
    return t


def _csv_head(f: Path) -> str | None:
    """The start of a CSV file as text (its first MiB; None for an empty file); unreadable
    text is an error naming the file."""
    opener = gzip.open if f.name.lower().endswith(".gz") else open
    try:
        with opener(f, "rb") as fh:
            head = fh.read(HEADER_BYTES)
    except OSError as exc:
        raise HybridflowInputError(f"cannot read CSV file {f}: {_first_line(exc)}") from None
    if not head.strip():
        return None
    if head.startswith(UTF16_BOMS) or _utf16_without_bom(head):
        raise HybridflowInputError(
            f"cannot read CSV file {f}: it is UTF-16 text (what Excel's 'Unicode Text' and "
            "PowerShell 5 write); CSV is read as UTF-8: convert it, e.g. "
            f"iconv -f UTF-16 -t UTF-8 {shlex.quote(str(f))} > events.csv (or save as "
            "'CSV UTF-8')"
        )
    if b"\x00" in head.split(b"\n", 1)[0]:
        raise HybridflowInputError(f"cannot read CSV file {f}: binary data, not CSV text")
    try:
        return head.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        if exc.start < len(head) - 3:  # not just a character cut at the end of the block
            line = head[: exc.start].count(b"\n") + 1
            raise HybridflowInputError(
                f"cannot read CSV file {f}: not UTF-8 text (byte 0x{head[exc.start]:02x} on "
                f"line {line}: Windows-1252 / Latin-1, as Excel's 'CSV (Comma delimited)' "
                "writes, is the likely encoding): convert it, e.g. iconv -f CP1252 -t UTF-8 "
                f"{shlex.quote(str(f))} > events.csv (or save as 'CSV UTF-8')"
            ) from None
        return head[: exc.start].decode("utf-8-sig")


UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")


def _utf16_without_bom(head: bytes) -> bool:
    """Whether the first line looks like UTF-16 ASCII text without a byte-order mark: every
    other byte NUL."""
    sample = head[:64]
    if len(sample) < 8:
        return False
    evens, odds = sample[0::2], sample[1::2]
    return evens.count(0) == len(evens) or odds.count(0) == len(odds)


def detect_delimiter(header: str) -> str:
    """The candidate delimiter that splits the header into the most columns (``,`` if none)."""
    counts = {d: header.count(d) for d in DELIMITERS}
    best = max(counts, key=lambda d: counts[d])
    return best if counts[best] else ","


def _refuse_space_separated(f: Path, header: str) -> None:
    """A header of several words and no delimiter is text aligned with spaces (CDNOW_master.txt,
    fixed-width reports): no CSV reader splits runs of spaces, so say how to convert it rather
    than read one column named after the whole header."""
    words = header.split()
    if len(words) < 2 or any(d in header for d in DELIMITERS):
        return
    raise HybridflowInputError(
        f"CSV file {f} looks separated by spaces (header {header.strip()!r}): hybridflow reads "
        "values separated by , ; tab or |, and a run of spaces is not one separator; convert "
        f"it, e.g. awk -v OFS=, '{{$1=$1}}1' {shlex.quote(str(f))} > events.csv, or give "
        "--csv-delimiter ' ' if exactly one space separates every value"
    )


def amounts_use_decimal_comma(values: Sequence[str | None], delimiter: str) -> bool:
    """Whether a CSV's amounts (``values``: the first rows' texts) are written with a decimal
    comma: the delimiter is not ``,``, some value is a number with a comma between digits
    (:data:`DECIMAL_COMMA_NUMBER`) and none has a decimal point (``12.50``, which the comma
    reading would misread; ``1.234`` counts as thousands). Values that are no number either
    way (``abc``) do not count: they are quarantined as ever."""
    if delimiter == ",":
        return False
    texts = [v.strip() for v in values if v is not None and v.strip()]
    comma = any("," in t and re.fullmatch(DECIMAL_COMMA_NUMBER, t) for t in texts)
    point = any(
        re.fullmatch(POINT_DECIMAL, t) and not re.fullmatch(GROUPED_THOUSANDS, t) for t in texts
    )
    return comma and not point


def decimal_comma_sql(text: str, matches: str) -> str:
    """SQL, in Spark's and DuckDB's dialect alike, for a decimal-comma number ``text`` rewritten
    as the engines' number parsers read numbers (``1.234,50`` -> ``1234.50``, ``12,5`` ->
    ``12.5``); ``matches``: the engine's function ``(text, pattern)`` true when the pattern
    matches somewhere in the text (Spark ``rlike``, DuckDB ``regexp_matches``)."""
    trimmed = f"trim({text})"
    return (
        f"CASE WHEN {matches}({trimmed}, '{GROUPED_THOUSANDS}') "
        f"THEN replace(replace({trimmed}, '.', ''), ',', '.') "
        f"ELSE replace({text}, ',', '.') END"
    )


def comma_grouped_sql(text: str, matches: str) -> str:
    """SQL, in Spark's and DuckDB's dialect alike, for an amount text with its thousands
    commas dropped when it is :data:`COMMA_GROUPED_THOUSANDS` (``1,234.50`` -> ``1234.50``),
    else as it is; ``matches`` as for :func:`decimal_comma_sql`."""
    trimmed = f"trim({text})"
    return (
        f"CASE WHEN instr({text}, ',') > 0 AND {matches}({trimmed}, '{COMMA_GROUPED_THOUSANDS}') "
        f"THEN replace({trimmed}, ',', '') ELSE {text} END"
    )


def _sample_values(f: Path, text: str, dialect: CsvDialect, index: int) -> list[str | None]:
    """The values of column ``index`` in the first :data:`SAMPLE_ROWS` records of a CSV head
    (``text``; a last record cut by the end of the block left out)."""
    reader = csv.reader(io.StringIO(text, newline=""), **dialect.python_reader_args())
    records: list[list[str]] = []
    try:
        next(reader, None)
        for record in reader:
            records.append(record)
            if len(records) > SAMPLE_ROWS:
                break
    except csv.Error:
        log.debug("the CSV sample of %s ends in a record Python's reader refuses", f)
    if len(records) <= SAMPLE_ROWS and not text.endswith(("\n", "\r")):
        records = records[:-1]
    return [r[index] if index < len(r) else None for r in records[:SAMPLE_ROWS]]


def _check_csv_files(
    files: list[Path], options: InputOptions
) -> tuple[CsvDialect, list[tuple[Path, str]], list[str]]:
    """The dialect (the delimiter given or detected from the first header), the non-empty
    files' heads and the first header's column names; all headers must agree (Spark applies
    the first file's header to every file) and name each needed column once."""
    heads = [(f, text) for f in files if (text := _csv_head(f)) is not None]
    if not heads:
        return options.csv_dialect(options.csv_delimiter or ","), [], []
    first_file, first_text = heads[0]
    first_line = first_text.splitlines()[0]
    if options.csv_delimiter is None:
        _refuse_space_separated(first_file, first_line)
    dialect = options.csv_dialect(options.csv_delimiter or detect_delimiter(first_line))
    names = _header_names(first_file, first_text, dialect)
    _check_header_names(first_file, first_line, names, options.column_map)
    want = [_norm(c) for c in names]
    for f, text in heads[1:]:
        got = [_norm(c) for c in _header_names(f, text, dialect)]
        if got != want:
            raise HybridflowInputError(
                f"CSV file {f} has header {got}, unlike {first_file} ({want}): "
                "all CSV files of one input need the same columns in the same order"
            )
    return dialect, heads, names


def _with_decimal_comma(dialect: CsvDialect, head: tuple[Path, str], amount: int) -> CsvDialect:
    """``dialect``, reading amounts with a decimal comma when the first file's first rows
    write them so (:func:`amounts_use_decimal_comma`)."""
    f, text = head
    if not amounts_use_decimal_comma(_sample_values(f, text, dialect, amount), dialect.delimiter):
        return dialect
    log.info("amounts are written with a decimal comma in %s (12,50 is 12.5)", f)
    return dataclasses.replace(dialect, decimal_comma=True)


def _check_header_names(f: Path, line: str, names: list[str], column_map: dict[str, str]) -> None:
    """Each needed column once (names are case-insensitive)."""
    want = [_norm(c) for c in names]
    needed = set(CONTRACT_COLUMNS) | {_norm(c) for c in column_map.values()}
    dupes = sorted({c for c in want if want.count(c) > 1 and c in needed})
    if dupes:
        raise HybridflowInputError(
            f"column {dupes[0]!r} appears more than once (names are case-insensitive) in "
            f"{f}: {line}"
        )


def _header_names(f: Path, text: str, dialect: CsvDialect) -> list[str]:
    """A CSV header's column names: the first record of ``text`` as every reader splits it
    (quoted names may hold the delimiter, a line break or a doubled quote). A header whose
    quote is never closed is refused: the readers would take the whole file as its name."""
    reader = csv.reader(io.StringIO(text, newline=""), strict=True, **dialect.python_reader_args())
    try:
        names = next(reader, [])
    except csv.Error as exc:
        raise HybridflowInputError(
            f"cannot read the header of CSV file {f}: {exc} (values are quoted with "
            f"{dialect.quote!r} and a quote inside a value is written "
            f"{dialect.escape + dialect.quote!r}; see --csv-quote, --csv-escape)"
        ) from None
    if len(names) == 1 and dialect.quote in names[0] and "\n" in names[0]:
        raise HybridflowInputError(
            f"cannot read the header of CSV file {f}: a quote {dialect.quote!r} is never "
            "closed (see --csv-quote, --csv-escape)"
        )
    return names


def inspect_events(path: str | Path, options: InputOptions) -> EventsInput:
    """Check a Parquet/CSV file or folder without an engine: ``--timestamp-format`` is a
    pattern Spark parses with, the path exists, has one format, its files are readable and
    agree, ``options.column_map`` fits and every required column is there. Every problem is an input error that names the file or column."""
    check_timestamp_format(options.timestamp_format)
    path = resolve_events_path(path)
    files = list_event_files(path)
    fmt = detect_format(files, path)
    delimiter, dialect, schema, schemas = None, None, None, []
    if fmt == "parquet":
        rows, names, schema, schemas = _check_parquet_files(files, path)
    else:
        dialect, heads, names = _check_csv_files(files, options)
        delimiter = dialect.delimiter
        rows = _csv_rows_estimate(files) if heads else 0
    if rows == 0:
        raise HybridflowInputError(f"events input is empty (no rows): {path}")
    columns, _ = mapped_names(names, options.column_map, path)
    check_required_columns(columns)
    if dialect is not None:
        dialect = _with_decimal_comma(dialect, heads[0], columns.index("amount"))
    if fmt == "parquet" and schema is None:
        _check_parquet_types(
            files,
            schemas,
            [n for c, n in zip(columns, names, strict=True) if c in CONTRACT_COLUMNS],
        )
    nanos = sorted(
        {
            f.name
            for sch in schemas
            for f in sch
            if pa.types.is_timestamp(f.type) and f.type.unit == "ns"
        }
    )
    sources = dict(zip(columns, names, strict=True)) if schema is not None else None
    if schema is not None:
        schema = pa.schema(
            [schema.field(n).with_name(c) for c, n in zip(columns, names, strict=True)]
        )
    return EventsInput(
        path=path,
        files=files,
        format=fmt,
        columns=columns,
        rows_estimate=rows,
        csv_delimiter=delimiter,
        csv_dialect=dialect,
        arrow_schema=schema,
        source_columns=sources,
        nanosecond_columns=tuple(nanos),
    )


def refuse_nanoseconds_for_spark(found: EventsInput) -> None:
    """Spark (4.x) reads no Parquet file with a nanosecond timestamp (pandas' ``to_parquet``
    writes ``datetime64[ns]`` so): an input error naming the columns and the fix, before Spark
    fails inside a job. The in-process engine reads such files."""
    if found.nanosecond_columns:
        columns = ", ".join(repr(c) for c in found.nanosecond_columns)
        raise HybridflowInputError(
            f"Parquet column(s) {columns} in {found.path} hold nanosecond timestamps, which "
            "Spark cannot read (only this machine's in-process engine does, up to "
            "HYBRIDFLOW_IN_PROCESS_ROWS rows and not for Hive-partitioned folders): write them "
            "as microseconds, e.g. pandas df.to_parquet(path, coerce_timestamps='us', "
            "allow_truncated_timestamps=True)"
        )


def check_required_columns(columns: Sequence[str]) -> None:
    """Every required contract column is among ``columns`` (contract names)."""
    missing = [c for c in REQUIRED_COLUMNS if c not in columns]
    if missing:
        raise HybridflowInputError(
            f"events are missing required column(s) {', '.join(missing)}; "
            f"found: {', '.join(columns) or '(none)'}; {_map_advice(missing, list(columns))}"
        )


NO_AMOUNT_ADVICE = (
    "; a log without purchase values (views and transactions only, like RetailRocket's "
    "events.csv) needs them: join each purchase's value from your orders, or add a column "
    "amount with one value on every row (e.g. 1) to rank customers by recency and frequency "
    "alone (the amount features are then constant)"
)


def _map_advice(missing: list[str], columns: list[str]) -> str:
    """``--map`` options that read the missing columns from likely input columns, or the form."""
    hints = column_map_hints(missing, columns)
    options = " ".join(f"--map {c}={shlex.quote(source)}" for c, source in hints.items())
    advice = f"if these are yours: {options}" if hints else "rename with --map column=yours"
    if letters_only(hints.get("amount", "")) in UNIT_PRICE_NAMES:
        advice += " (amount is the event's total value: a unit price undercounts multi-item rows)"
    if "amount" in missing and "amount" not in hints:
        advice += NO_AMOUNT_ADVICE
    return advice


def warn_extra_columns(columns: Sequence[str]) -> None:
    """Log the input's columns (contract names) that validation ignores."""
    extra = [c for c in columns if c not in CONTRACT_COLUMNS]
    if extra:
        log.warning("ignoring extra event columns: %s", ", ".join(extra))


def read_events(
    spark: SparkSession,
    path: str | Path,
    options: InputOptions,
    found: EventsInput | None = None,
) -> RawEvents:
    """Read a Parquet/CSV file or folder (Hive partitions included) with contract column names.

    The files are checked first (:func:`inspect_events`, unless the caller did: ``found``).
    Column names are matched case-insensitively; ``options.column_map`` renames the input's
    columns onto the contract. CSV values are read as strings and parsed by ``conform_events``.
    """
    from pyspark.errors import PySparkException

    found = found or inspect_events(path, options)
    refuse_nanoseconds_for_spark(found)
    path = found.path
    dialect = found.csv_dialect or options.csv_dialect(found.csv_delimiter or ",")
    if found.format == "parquet":
        reader = spark.read
    else:
        log.info(
            "reading CSV: delimiter %r, quote %r, escape %r, decimal comma %s",
            dialect.delimiter,
            dialect.quote,
            dialect.escape,
            dialect.decimal_comma,
        )
        reader = (
            spark.read.option("header", True)
            .option("inferSchema", False)
            .options(**dialect.spark_options())
            .option("mode", "PERMISSIVE")
        )
    try:
        df = reader.parquet(str(path)) if found.format == "parquet" else reader.csv(str(path))
    except PySparkException as exc:
        raise HybridflowInputError(
            f"cannot read events file(s) at {path}: {_first_line(exc)}"
        ) from None
    df = map_columns(df, options.column_map, path)
    check_column_types(df, path)
    ts_format = options.timestamp_format or detect_timestamp_format(df, path)
    return RawEvents(
        df=df,
        path=path,
        files=found.files,
        format=found.format,
        timestamp_format=ts_format,
        rows_estimate=found.rows_estimate,
        decimal_comma=found.format == "csv" and dialect.decimal_comma,
    )


def _csv_rows_estimate(files: list[Path]) -> int:
    """About how many lines the CSV files hold (sizes only; nothing is read)."""
    size = sum(
        f.stat().st_size * (GZIP_RATIO if f.name.lower().endswith(".gz") else 1) for f in files
    )
    return max(1, size // CSV_BYTES_PER_ROW)


def map_columns(df: DataFrame, column_map: dict[str, str], path: Path) -> DataFrame:
    """Rename the input's columns onto the contract: ``column_map`` first, then lower-case."""
    names, ignored = mapped_names(df.columns, column_map, path)
    for c in ignored:
        log.warning("ignoring input column %r: --map put another column in its place", c)
    return df.toDF(*names)


def mapped_names(
    columns: Sequence[str], column_map: dict[str, str], path: Path
) -> tuple[list[str], list[str]]:
    """The names ``columns`` get on the contract (``column_map`` first, then lower-case), and
    the input columns a mapping put another column in place of (renamed ``_unmapped_*``)."""
    bad_targets = sorted(set(column_map) - set(CONTRACT_COLUMNS))
    if bad_targets:
        raise HybridflowInputError(
            f"--map target {bad_targets[0]!r} is not an events column; "
            f"expected one of {', '.join(CONTRACT_COLUMNS)}"
        )
    by_lower: dict[str, list[str]] = {}
    for c in columns:
        by_lower.setdefault(_norm(c), []).append(c)
    renamed: dict[str, str] = {}
    for target, source in column_map.items():
        matches = by_lower.get(_norm(source), [])
        if not matches:
            raise HybridflowInputError(
                f"--map {target}={source}: no column {source!r} in {path}; "
                f"found: {', '.join(columns) or '(none)'}"
            )
        renamed[matches[0]] = target
    names, ignored = [], []
    for c in columns:
        if c in renamed:
            names.append(renamed[c])
        elif _norm(c) in renamed.values():
            ignored.append(c)
            names.append(f"_unmapped_{_norm(c)}")
        else:
            names.append(_norm(c))
    dupes = sorted({n for n in names if names.count(n) > 1 and n in CONTRACT_COLUMNS})
    if dupes:
        raise HybridflowInputError(
            f"column {dupes[0]!r} appears more than once (names are case-insensitive) in {path}: "
            f"{', '.join(columns)}"
        )
    return names, ignored


def check_column_types(df: DataFrame, path: Path) -> None:
    """A contract column whose type cannot be cast (e.g. an array amount) is an input error."""
    for name, dtype in df.dtypes:
        allowed = ALLOWED_TYPES.get(name)
        if allowed is None:
            continue
        base = dtype.split("(")[0].split("<")[0]
        if base not in allowed:
            hint = ""
            if name == "event_time" and base in ("tinyint", "smallint", "int", "bigint"):
                hint = (
                    " (numbers are not read as times: dates like 19970101 or epoch seconds "
                    "written as text are detected, or give --timestamp-format)"
                )
            raise HybridflowInputError(
                f"column {name!r} in {path} has type {dtype}, which cannot be cast; "
                f"expected one of: {', '.join(sorted(allowed))}{hint}"
            )


def detect_timestamp_format(df: DataFrame, path: Path) -> str | None:
    """For a string ``event_time``: None for ISO-8601 (Spark's own cast), else the candidate
    format that parses the most of a small sample (a tie: of the whole column). No parsable
    sample at all is an error."""
    from pyspark.errors import PySparkException
    from pyspark.sql import functions as F

    from tasks.data.event_time_spark import parsed_counts

    if "event_time" not in df.columns or dict(df.dtypes)["event_time"] != "string":
        return None
    try:
        rows = (
            df.select(F.trim("event_time").alias("t"))
            .where(F.col("t").isNotNull() & (F.col("t") != ""))
            .limit(SAMPLE_ROWS)
            .collect()
        )
    except PySparkException as exc:
        raise HybridflowInputError(
            f"cannot read events file(s) at {path}: {_first_line(exc)}"
        ) from None
    samples = [r["t"] for r in rows]
    return choose_timestamp_format(samples, path, partial(parsed_counts, df))


def choose_timestamp_format(
    samples: Sequence[str], path: Path, count_parsed: ParsedCounts | None = None
) -> str | None:
    """The format that parses the most of the ``samples`` (trimmed, non-empty ``event_time``
    texts, whichever engine read them): None for ISO-8601, an epoch name or a Spark pattern of
    :data:`TIMESTAMP_CANDIDATES`. When several parse as many samples (``12/1/2010 8:26`` is
    d/M or M/d; a log sorted by time can start with days 1-12 only), the one that parses the
    most values of the whole column, as ``count_parsed`` counts them, wins. No parsable sample
    at all is an error."""
    if not samples:
        return None
    scores: dict[str | None, int] = {None: sum(bool(ISO_TIME.match(s)) for s in samples)}
    digits = [s for s in samples if s.isascii() and s.isdigit()]
    for width, py_fmt, spark_fmt in COMPACT_CANDIDATES:
        scores[spark_fmt] = sum(len(s) == width and _parses(s, py_fmt) for s in digits)
    scores[EPOCH_SECONDS] = sum(len(s) in EPOCH_SECONDS_DIGITS for s in digits)
    scores[EPOCH_MILLIS] = sum(len(s) in EPOCH_MILLIS_DIGITS for s in digits)
    for py_fmt, spark_fmt in TIMESTAMP_CANDIDATES:
        scores[spark_fmt] = sum(_parses(s, py_fmt) for s in samples)
    best = max(scores.values())
    if best == 0:
        raise HybridflowInputError(
            f"cannot parse event_time values like {samples[0]!r} in {path}: "
            "give the format with --timestamp-format (a Spark datetime pattern)"
        )
    winners = _dates_over_epochs([fmt for fmt, n in scores.items() if n == best])
    if len(winners) > 1 and count_parsed is not None:
        winners = _most_parsed(winners, count_parsed(winners), len(samples))
    if len(winners) > 1:
        log.warning(
            "event_time format is ambiguous (%s); using %r: set --timestamp-format to choose",
            ", ".join(str(w) for w in winners),
            winners[0],
        )
    if winners[0] is not None:
        log.info("event_time format detected: %s", winners[0])
    return winners[0]


def _dates_over_epochs(formats: list[str | None]) -> list[str | None]:
    """``formats`` without the epoch readings when a compact date reads the same samples: a
    valid month, day, hour and minute in each of them (``202601051030``) is what a date column
    holds; epoch milliseconds rarely fit it (about 1 value in 200), all the samples never."""
    compact = {spark_fmt for _, _, spark_fmt in COMPACT_CANDIDATES}
    if not compact.intersection(formats):
        return formats
    return [f for f in formats if f not in (EPOCH_SECONDS, EPOCH_MILLIS)]


def _most_parsed(
    formats: list[str | None], counts: dict[str | None, int], n_samples: int
) -> list[str | None]:
    """The ``formats`` that parse the most values of the column, in their order."""
    most = max(counts[f] for f in formats)
    log.info(
        "event_time: the first %d values fit %s alike; over the whole column they parse %s",
        n_samples,
        ", ".join(str(f) for f in formats),
        ", ".join(f"{counts[f]:,} ({f})" for f in formats),
    )
    return [f for f in formats if counts[f] == most]


def _parses(value: str, py_fmt: str) -> bool:
    try:
        dt.datetime.strptime(value, py_fmt)
    except ValueError:
        return False
    return True


def _norm(name: str) -> str:
    return name.replace("\ufeff", "").strip().lower()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
