"""Argument types and shared option groups for the subcommands."""

from __future__ import annotations

import argparse
import datetime as dt

EXIT_OK, EXIT_FAILURE, EXIT_BAD_INPUT = 0, 1, 2


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


def add_run_args(p: argparse.ArgumentParser) -> None:
    """Options shared by ``run`` and ``features``."""
    p.add_argument("--events", required=True, help="Parquet/CSV file or folder of events")
    p.add_argument("--as-of", type=iso_date, default=None, help="T (default: last event's date)")
    p.add_argument("--horizon-days", type=int, default=None, help="H (default 90)")
    p.add_argument("--max-bad-fraction", type=fraction, default=None, help="default 0.05")
    p.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
