"""``hybridflow demo-data``: synthetic events with a planted signal."""

from __future__ import annotations

import argparse
import datetime as dt
from pathlib import Path

from cli.args import EXIT_OK, fraction, iso_date


def register(sub: argparse._SubParsersAction) -> None:
    """Add the subcommand."""
    p = sub.add_parser("demo-data", help="generate synthetic events with a planted signal")
    p.add_argument("--customers", type=int, default=20_000)
    p.add_argument("--days", type=int, default=730)
    p.add_argument("--out", type=Path, default=Path("data/demo-events"))
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--end-date", type=iso_date, default=dt.date(2025, 12, 31))
    p.add_argument("--bad-row-fraction", type=fraction, default=0.001)
    p.add_argument(
        "--customers-per-file",
        type=int,
        default=200_000,
        help="customers generated per chunk/file; peak memory grows with this, not --customers",
    )
    p.add_argument(
        "--shift-after",
        type=iso_date,
        default=None,
        help="plant a drift: after this date purchases are --shift-purchase-factor times as "
        "frequent and --shift-app-share of events move to the app channel",
    )
    p.add_argument("--shift-purchase-factor", type=float, default=2.0)
    p.add_argument("--shift-app-share", type=fraction, default=0.5)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Generate and describe the demo data."""
    from tasks.data.demo_events import DemoDataParams, generate_demo_events

    summary = generate_demo_events(
        DemoDataParams(
            customers=args.customers,
            days=args.days,
            seed=args.seed,
            end_date=args.end_date,
            bad_row_fraction=args.bad_row_fraction,
            customers_per_file=args.customers_per_file,
            shift_after=args.shift_after,
            shift_purchase_factor=args.shift_purchase_factor,
            shift_app_share=args.shift_app_share,
        ),
        args.out,
    )
    print(
        f"wrote {summary.events:,} events for {summary.customers:,} customers "
        f"({summary.bad_rows} deliberately bad rows) to {summary.path}\n"
        f"events span {summary.start:%Y-%m-%d} .. {summary.end:%Y-%m-%d}"
    )
    return EXIT_OK
