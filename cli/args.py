"""Argument types and shared option groups for the subcommands."""

from __future__ import annotations

import argparse
import datetime as dt
from pathlib import Path
from typing import Any

EXIT_OK, EXIT_FAILURE, EXIT_BAD_INPUT = 0, 1, 2
EXIT_DRIFTED = 3  # `hybridflow drift`: a measure is above its threshold


def iso_date(value: str) -> dt.date:
    """argparse type: YYYY-MM-DD."""
    try:
        return dt.date.fromisoformat(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a date (YYYY-MM-DD): {value!r}") from None


def fraction(value: str) -> float:
    """argparse type: a number in [0, 1]."""
    try:
        f = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {value!r}") from None
    if not 0.0 <= f <= 1.0:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1: {value}")
    return f


def horizon_days(value: str) -> int:
    """argparse type: whole days within the horizons a run may have."""
    from infra.settings import HORIZON_DAYS_MAX, HORIZON_DAYS_MIN

    try:
        days = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number of days: {value!r}") from None
    if not HORIZON_DAYS_MIN <= days <= HORIZON_DAYS_MAX:
        raise argparse.ArgumentTypeError(
            f"must be between {HORIZON_DAYS_MIN} and {HORIZON_DAYS_MAX} days: {value}"
        )
    return days


def port_number(value: str) -> int:
    """argparse type: a TCP port, 0-65535 (0: any free port)."""
    try:
        port = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {value!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"must be between 0 and 65535: {value}")
    return port


def run_id(value: str) -> str:
    """argparse type: a run id as the store's keys hold it (no path, no '..')."""
    from infra.errors import HybridflowInputError
    from infra.layout import check_run_id

    try:
        return check_run_id(value)
    except HybridflowInputError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def column_mapping(value: str) -> tuple[str, str]:
    """argparse type: ``contract_column=source_column``."""
    target, sep, source = value.partition("=")
    if not sep or not target.strip() or not source.strip():
        raise argparse.ArgumentTypeError(f"expected column=source_column, got {value!r}")
    return target.strip().lower(), source.strip()


def delimiter(value: str) -> str:
    """argparse type: one character; ``\\t`` or ``tab`` for a tab."""
    value = {"\\t": "\t", "tab": "\t"}.get(value, value)
    if len(value) != 1:
        raise argparse.ArgumentTypeError(f"a delimiter is one character, got {value!r}")
    return value


def one_character(value: str) -> str:
    """argparse type: one character (a CSV quote or escape)."""
    if len(value) != 1:
        raise argparse.ArgumentTypeError(f"expected one character, got {value!r}")
    return value


def events_path(args: argparse.Namespace) -> Path:
    """``--events`` as an absolute local path (a symbolic link loop is an input error)."""
    from tasks.data.input_formats import resolve_events_path

    return resolve_events_path(args.events)


def check_events_and_start_engines(args: argparse.Namespace) -> bool:
    """Fail on a missing or unreadable input, a ``--map`` that does not fit it or a missing
    required column from the files' headers and footers alone, before the flows import and
    Prefect's API starts (an input error, exit 2); then start Prefect's temporary API (without
    a configured one) and, unless every CPU stage will run in this process (the stages' engine
    choice on the events, the largest input: :func:`tasks.data.engine_choice.run_needs_spark`),
    the JVM, sized for the input's rows, in the background while the caller imports and starts
    its flow. True when it started the JVM (the run has Spark stages)."""
    from infra.compute.spark import SparkOnDemand, start_spark_in_background
    from infra.prefect_runtime.api import start_temporary_api
    from infra.settings import get_settings
    from tasks.data.engine_choice import run_needs_spark
    from tasks.data.input_formats import InputOptions, input_defaults, inspect_events
    from tasks.stages.validate import engine_inputs

    settings = get_settings()
    given = InputOptions.model_validate(_input_options(args))
    options = given.merged_with(input_defaults(settings))
    found = inspect_events(events_path(args), options)
    start_temporary_api(settings)
    cluster = SparkOnDemand(settings).local_cores() is None
    if not run_needs_spark(
        engine_inputs(found, settings.in_process_rows, cluster, options.timestamp_format)
    ):
        return False
    start_spark_in_background(settings, found.rows_estimate)
    return True


def _input_options(args: argparse.Namespace) -> dict[str, Any]:
    """``--map``, ``--csv-delimiter`` and ``--timestamp-format`` as ``InputOptions`` fields."""
    return {
        "column_map": dict(args.map),
        "csv_delimiter": args.csv_delimiter,
        "csv_quote": args.csv_quote,
        "csv_escape": args.csv_escape,
        "timestamp_format": args.timestamp_format,
        "purchase_event": args.purchase_event,
    }


def run_inputs(args: argparse.Namespace) -> dict[str, Any]:
    """The shared run options (:func:`add_run_args`) as the fields of ``flows.params.RunInputs``."""
    return {
        "events": str(events_path(args)),
        "as_of": args.as_of,
        "horizon_days": args.horizon_days,
        "as_of_after_events": args.as_of_after_events,
        "max_bad_fraction": args.max_bad_fraction,
        "device": args.device,
        "input": _input_options(args),
        "use_cache": False if args.no_cache else None,
    }


def family_list(value: str) -> list[str]:
    """argparse type: comma-separated model families (``logistic,gbm,mlp``)."""
    names = [name.strip() for name in value.split(",") if name.strip()]
    if not names:
        raise argparse.ArgumentTypeError(
            f"expected family names such as logistic,gbm, got {value!r}"
        )
    return names


def add_families_arg(p: argparse.ArgumentParser) -> None:
    """``--families``: which model families contend (the settings' list when absent)."""
    p.add_argument(
        "--families",
        type=family_list,
        default=None,
        metavar="A,B",
        help="model families that contend, e.g. rfm,logistic,gbm,mlp "
        "(default: HYBRIDFLOW_TRAIN__FAMILIES); the champion goes to the promotion gate",
    )


def add_run_args(p: argparse.ArgumentParser) -> None:
    """Options shared by ``run`` and ``features``."""
    p.add_argument("--events", required=True, help="Parquet/CSV file or folder of events")
    p.add_argument("--as-of", type=iso_date, default=None, help="T (default: last event's date)")
    p.add_argument(
        "--as-of-after-events",
        action="store_true",
        help="accept an --as-of after the last event's day (the label window then holds fewer "
        "days of events than the horizon; the run says how many)",
    )
    p.add_argument("--horizon-days", type=horizon_days, default=None, help="H (default 90)")
    p.add_argument("--max-bad-fraction", type=fraction, default=None, help="default 0.05")
    p.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    p.add_argument(
        "--map",
        type=column_mapping,
        action="append",
        default=[],
        metavar="COLUMN=SOURCE",
        help="read the contract COLUMN from the input's SOURCE column (repeatable)",
    )
    p.add_argument("--csv-delimiter", type=delimiter, default=None, help="default: detected")
    p.add_argument(
        "--csv-quote", type=one_character, default=None, help='CSV quote character (default ")'
    )
    p.add_argument(
        "--csv-escape",
        type=one_character,
        default=None,
        help="character before a quote inside a quoted CSV value (default: the quote itself, "
        'RFC 4180: "" is one quote; e.g. \\ for exports that write \\")',
    )
    p.add_argument(
        "--timestamp-format",
        default=None,
        help="event_time format: Spark pattern like 'dd/MM/yyyy HH:mm', epoch_seconds or "
        "epoch_millis (default: detected)",
    )
    p.add_argument(
        "--purchase-event",
        default=None,
        metavar="VALUE",
        help="the event_type value that is a purchase (e.g. checkout), besides purchase and its "
        "synonyms transaction, order, sale, buy",
    )
    p.add_argument(
        "--no-cache",
        action="store_true",
        help="recompute validate/features/preprocess even when their inputs are unchanged",
    )
