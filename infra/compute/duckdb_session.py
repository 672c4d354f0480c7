"""DuckDB connections for the stages that compute in the flow's process: memory bounded by the
``in_process_memory`` setting (unset: a share of the machine's memory), spilling beyond it into
a folder of its own under the work dir (DuckDB creates the folder and removes it when the
connection closes)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol

import duckdb

from infra.errors import HybridflowInputError
from infra.settings import get_settings


def duckdb_connection(
    *, threads: int | None = None, memory: str | None = None
) -> duckdb.DuckDBPyConnection:
    """A new in-memory DuckDB database with the memory limit (``memory``, default
    :func:`memory_limit`), a private spill folder and UTC as its time zone, on ``threads``
    threads (default: DuckDB's, one per core); close it when done."""
    spill = _spill_root() / f"duckdb-{os.getpid()}-{uuid.uuid4().hex[:12]}"
    config: dict[str, str | int] = {
        "memory_limit": memory or memory_limit(),
        "temp_directory": str(spill),
    }
    if threads is not None:
        config["threads"] = threads
    connection = duckdb.connect(config=config)
    connection.execute("SET TimeZone = 'UTC'")
    return connection


def scratch_dir(purpose: str) -> Path:
    """A new empty folder of this process under the work dir's spill folder, for files a
    stage writes beside DuckDB's own spill (the caller removes it)."""
    path = _spill_root() / f"{purpose}-{os.getpid()}-{uuid.uuid4().hex[:12]}"
    path.mkdir()
    return path


def _spill_root() -> Path:
    """The work dir's spill folder (created)."""
    root = get_settings().work_dir / "spill"
    root.mkdir(parents=True, exist_ok=True)
    return root


IN_PROCESS_REMEDY = (
    "raise HYBRIDFLOW_IN_PROCESS_MEMORY, or lower HYBRIDFLOW_IN_PROCESS_ROWS so that Spark "
    "computes it"
)


@contextmanager
def memory_bounded(
    work: str, limit: str | None = None, remedy: str = IN_PROCESS_REMEDY
) -> Iterator[None]:
    """Report DuckDB running out of its memory limit (``limit``, default :func:`memory_limit`)
    during ``work`` as an error naming the settings that fix it (``remedy``)."""
    try:
        yield
    except duckdb.OutOfMemoryException as exc:
        raise HybridflowInputError(
            f"{work} needs more memory than DuckDB may hold in this process "
            f"({limit or memory_limit()}): {remedy}"
        ) from exc


def memory_limit() -> str:
    """The ``in_process_memory`` setting, or :func:`default_memory_limit`."""
    return get_settings().in_process_memory or default_memory_limit()


DEFAULT_MEMORY_SHARE = 0.4
"""Of the machine's memory, what DuckDB may hold by default: the flow's own Python objects (Arrow
outputs, the model) and a train subprocess live beside it."""


def default_memory_limit(sharers: int = 1) -> str:
    """``DEFAULT_MEMORY_SHARE`` of :func:`machine_memory_bytes`, split between ``sharers``
    processes that hold it at once, as a DuckDB memory limit."""
    return f"{int(machine_memory_bytes() * DEFAULT_MEMORY_SHARE / max(1, sharers)) >> 20}MiB"


def task_memory_limit(slots: int) -> str:
    """What DuckDB may hold in a Spark task's Python worker while ``slots`` tasks run at once on
    its machine: the ``in_process_memory`` setting (each worker is a process of its own), or the
    default share of this machine's memory split between them."""
    return get_settings().in_process_memory or default_memory_limit(slots)


CGROUP_MEMORY_LIMITS = (
    Path("/sys/fs/cgroup/memory.max"),  # cgroup v2 ("max": none)
    Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"),  # cgroup v1 (a huge number: none)
)


def machine_memory_bytes(cgroup_limits: Sequence[Path] = CGROUP_MEMORY_LIMITS) -> int:
    """The memory this process may use: the machine's, or its container's limit when lower."""
    usable = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for path in cgroup_limits:
        try:
            limit = path.read_text().strip()
        except OSError:
            continue
        if limit.isdigit():
            usable = min(usable, int(limit))
    return usable


def parquet_files_sql(files: Sequence[Path]) -> str:
    """A DuckDB relation over the Parquet ``files`` (folder names never become columns)."""
    paths = ", ".join(sql_string(str(path)) for path in files)
    return f"read_parquet([{paths}], hive_partitioning = false)"


class CsvReading(Protocol):
    """How CSV text splits into values (``tasks.data.input_formats.CsvDialect``)."""

    @property
    def delimiter(self) -> str: ...

    @property
    def quote(self) -> str: ...

    @property
    def escape(self) -> str: ...


def csv_files_sql(files: Sequence[Path], dialect: CsvReading, names: Sequence[str]) -> str:
    """A DuckDB relation over CSV ``files`` with a header row, read with ``dialect``'s
    delimiter, quote and escape; every value text in the columns ``names`` (by position), a
    short row padded with nulls, a long row's extra values dropped (as Spark's permissive
    reader). One thread per scan: DuckDB's parallel scanner cannot pad rows when a quoted
    value holds a line break (Spark's ``multiLine`` reader reads a file in one task too)."""
    paths = ", ".join(sql_string(str(path)) for path in files)
    columns = ", ".join(f"{sql_string(n)}: 'VARCHAR'" for n in names)
    return (
        f"read_csv([{paths}], header = true, auto_detect = false, columns = {{{columns}}}, "
        f"delim = {sql_string(dialect.delimiter)}, quote = {sql_string(dialect.quote)}, "
        f"escape = {sql_string(dialect.escape)}, null_padding = true, strict_mode = false, "
        "parallel = false)"
    )


def sql_string(text: str) -> str:
    """``text`` as a DuckDB string literal."""
    return "'" + text.replace("'", "''") + "'"


def sql_identifier(name: str) -> str:
    """``name`` as a DuckDB identifier (a column or table name)."""
    return '"' + name.replace('"', '""') + '"'
