"""Text values parsed in DuckDB exactly as Spark's casts parse them, for input that arrives as
text (a CSV's columns, string columns in Parquet): numbers, ISO-8601 timestamps, epoch seconds
or milliseconds and the datetime patterns :mod:`tasks.data.timestamp_patterns` translates.

Each is a DuckDB macro whose results equal Spark's (``try_cast`` to double or bigint,
``try_cast`` to timestamp, ``try_to_timestamp`` with a pattern) on the values
``tests/unit/tasks/data/test_text_values_duckdb.py`` holds them equal on. Known differences,
where the in-process engine reads no value (the row is quarantined as it would be for any
unparsable value) and Spark reads one: hexadecimal numbers (``0x1p3``), timestamps with a
region zone name (``Europe/Paris``) and times without a date (``10:00``, which Spark dates
today).
"""

from __future__ import annotations

from tasks.data.timestamp_patterns import EPOCH_MILLIS, EPOCH_SECONDS, duckdb_pattern

# A number as Java's Double.parseDouble reads it (an optional f/d suffix), or a special literal
# Spark reads case-insensitively. DuckDB's own cast also takes '1_000'; Spark does not.
_NUMBER = r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?[fFdD]?"
_SPECIAL = "('nan', 'inf', '+inf', '-inf', 'infinity', '+infinity', '-infinity')"
_ISO = (
    r"^([+-]?\d{4,6})(?:-(\d{1,2})(?:-(\d{1,2})(?:[T ](\d{1,2})(?::(\d{1,2})(?::(\d{1,2})"
    r"(?:\.(\d*))?)?)?)?)?)?\s*(Z|(?:GMT|UTC|UT)?(?:[+-]\d{1,2}(?::\d{2}(?::\d{2})?)?"
    r"|[+-]\d{4}(?:\d{2})?)?)$"
)
_ZONE = r"([+-])(\d{1,2}):?(\d{2})?:?(\d{2})?$"
MAX_ZONE_SECONDS = 18 * 3600

MACROS: dict[str, str] = {
    # Spark trims what Java's String.trim does: every character up to the space
    "java_trim(x)": r"""regexp_replace(x, '^[\x00-\x20]+|[\x00-\x20]+$', '', 'g')""",
    "spark_double(x)": f"""CASE
        WHEN regexp_full_match(java_trim(x), '{_NUMBER}')
            THEN TRY_CAST(rtrim(java_trim(x), 'fFdD') AS DOUBLE)
        WHEN lower(java_trim(x)) IN {_SPECIAL} THEN TRY_CAST(java_trim(x) AS DOUBLE)
        END""",
    "spark_bigint(x)": r"""CASE WHEN regexp_full_match(java_trim(x), '[+-]?\d+')
        THEN TRY_CAST(java_trim(x) AS BIGINT) END""",
    "iso_parts(t)": f"regexp_extract(t, '{_ISO}', ['y', 'mo', 'd', 'h', 'mi', 's', 'f', 'z'])",
    "iso_zone_seconds(z)": f"""CASE WHEN NOT regexp_matches(z, '[+-]') THEN 0 ELSE (
        CASE WHEN regexp_extract(z, '{_ZONE}', 1) = '-' THEN -1 ELSE 1 END) * (
        CAST(regexp_extract(z, '{_ZONE}', 2) AS BIGINT) * 3600
        + coalesce(TRY_CAST(regexp_extract(z, '{_ZONE}', 3) AS BIGINT), 0) * 60
        + coalesce(TRY_CAST(regexp_extract(z, '{_ZONE}', 4) AS BIGINT), 0)) END""",
    "iso_micros_of(p, zone)": f"""CASE WHEN p.y <> ''
        AND coalesce(TRY_CAST(nullif(p.h, '') AS INT), 0) < 24
        AND coalesce(TRY_CAST(nullif(p.mi, '') AS INT), 0) < 60
        AND coalesce(TRY_CAST(nullif(p.s, '') AS INT), 0) < 60
        AND abs(zone) <= {MAX_ZONE_SECONDS} THEN
        epoch_us(try(make_timestamp(
            CAST(p.y AS BIGINT),
            CAST(coalesce(nullif(p.mo, ''), '1') AS BIGINT),
            CAST(coalesce(nullif(p.d, ''), '1') AS BIGINT),
            CAST(coalesce(nullif(p.h, ''), '0') AS BIGINT),
            CAST(coalesce(nullif(p.mi, ''), '0') AS BIGINT),
            CAST(coalesce(nullif(p.s, ''), '0') AS DOUBLE))))
        + CAST(rpad(left(p.f, 6), 6, '0') AS BIGINT) - zone * 1000000 END""",
    # the parts bound once per value through a one-element lambda: written inline, DuckDB
    # expands iso_parts(t) at each of its ~15 uses and the whole parse costs 10x (0.52 against
    # 0.05 s for 64,555 values; 0.13 s this way)
    "iso_micros(t)": (
        "list_transform([iso_parts(t)], lambda p: iso_micros_of(p, iso_zone_seconds(p.z)))[1]"
    ),
    "epoch_micros(x, scale)": """TRY_CAST(CAST(spark_bigint(x) AS HUGEINT) * scale AS BIGINT)""",
}
"""Every macro, by its signature, for :func:`define_text_macros`."""


def define_text_macros(execute) -> None:
    """Create the macros on a DuckDB connection (``execute``: its ``execute`` method)."""
    for signature, body in MACROS.items():
        execute(f"CREATE OR REPLACE TEMP MACRO {signature} AS {body}")


def text_time_micros(column: str, timestamp_format: str | None) -> str:
    """SQL for a text ``column`` as microseconds since the epoch (UTC; null when unparsable),
    as Spark's ``parse_event_time`` reads it with ``timestamp_format`` (None: ISO-8601)."""
    text = f"trim({column}, ' ')"
    if timestamp_format is None:
        return f"iso_micros({text})"
    if timestamp_format == EPOCH_SECONDS:
        return f"epoch_micros({text}, 1000000)"
    if timestamp_format == EPOCH_MILLIS:
        return f"epoch_micros({text}, 1000)"
    pattern = duckdb_pattern(timestamp_format)
    if pattern is None:
        raise ValueError(f"DuckDB does not parse the pattern {timestamp_format!r} as Spark does")
    regex, fmt = pattern.regex.replace("'", "''"), pattern.format.replace("'", "''")
    return (
        f"CASE WHEN regexp_full_match({text}, '{regex}') "
        f"THEN epoch_us(try_strptime({text}, '{fmt}')) END"
    )


def parses_in_process(timestamp_format: str | None) -> bool:
    """Whether :func:`text_time_micros` reads times of ``timestamp_format`` as Spark does."""
    return timestamp_format in (None, EPOCH_SECONDS, EPOCH_MILLIS) or (
        duckdb_pattern(timestamp_format) is not None
    )
