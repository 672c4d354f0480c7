"""``hybridflow drift``: the drift table of the features at a date against production."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from cli.args import EXIT_DRIFTED, EXIT_OK, iso_date
from infra.prefect_runtime.api import prefect_api, start_temporary_api

COLUMNS = ("feature", "measure", "value", "threshold", "status")


def register(sub: argparse._SubParsersAction) -> None:
    """Add the subcommand."""
    p = sub.add_parser(
        "drift",
        help="compare the features published for a date with production's training data "
        "(exit 0: within thresholds, 3: drifted)",
    )
    p.add_argument("--as-of", type=iso_date, required=True, help="date of the features (T)")
    p.add_argument(
        "--model-version", default=None, help="compare with this version (default: production)"
    )
    p.add_argument("--json", action="store_true", help="print the report as one JSON line")
    p.set_defaults(handler=run)


def format_table(rows: Sequence[dict[str, object]]) -> str:
    """The drift table, fixed width, one row per measure."""
    cells = [[_cell(row[c]) for c in COLUMNS] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(COLUMNS)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(COLUMNS, widths, strict=True)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    return "\n".join(lines)


def _cell(value: object) -> str:
    if value is None:
        return "-"
    return f"{value:.4f}" if isinstance(value, float) else str(value)


def run(args: argparse.Namespace) -> int:
    """Run the drift check in this process; exit 3 when anything drifted."""
    from infra.settings import get_settings

    start_temporary_api(get_settings())
    from flows.artifacts import drift_table_rows
    from flows.drift import DriftParams, drift_flow
    from tasks.stages.drift import drift_status_line

    with prefect_api():
        report = drift_flow(DriftParams(as_of=args.as_of, model_version=args.model_version))
    if args.json:
        print(report.model_dump_json())
    else:
        print(format_table(drift_table_rows(report)))
        print(
            f"{drift_status_line(report)} "
            f"({report.rows_compared:,} customers; training features at "
            f"{report.reference_as_of} - {report.reference_horizon_days} days)"
        )
    return EXIT_DRIFTED if report.drifted else EXIT_OK
