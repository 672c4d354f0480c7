"""``hybridflow refresh``: the model-refresh flow in this process (embedded mode)."""

from __future__ import annotations

import argparse

from cli.args import (
    EXIT_OK,
    add_families_arg,
    events_path,
    fraction,
    horizon_days,
    iso_date,
)
from infra.prefect_runtime.api import prefect_api, start_temporary_api


def register(sub: argparse._SubParsersAction) -> None:
    """Add the subcommand."""
    p = sub.add_parser(
        "refresh", help="fine-tune production on the newest data and promote through the gate"
    )
    p.add_argument("--events", required=True, help="Parquet/CSV file or folder of events")
    p.add_argument("--as-of", type=iso_date, required=True, help="T: newest date to learn from")
    p.add_argument("--horizon-days", type=horizon_days, default=None, help="default: production's")
    p.add_argument(
        "--promote",
        choices=["if-better", "always"],
        default="if-better",
        help="if-better: the gate decides (default); always: promote the candidate regardless",
    )
    p.add_argument("--max-bad-fraction", type=fraction, default=None, help="default 0.05")
    p.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    p.add_argument("--json", action="store_true", help="print the result as one JSON line")
    add_families_arg(p)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Run the refresh flow and print what happened."""
    from infra.settings import get_settings

    start_temporary_api(get_settings())
    from flows.refresh import RefreshParams, refresh_flow

    with prefect_api():
        result = refresh_flow(
            RefreshParams(
                events=str(events_path(args)),
                as_of=args.as_of,
                horizon_days=args.horizon_days,
                promote=args.promote,
                max_bad_fraction=args.max_bad_fraction,
                device=args.device,
                families=args.families,
            )
        )
    if args.json:
        print(result.model_dump_json())
        return EXIT_OK
    moved = "promoted" + (" (forced)" if result.forced else "") if result.promoted else "kept out"
    print(
        f"refresh {result.run_id} as_of {result.as_of} (horizon {result.horizon_days} days) "
        f"in {result.seconds:.0f}s\n"
        f"  candidate  : {result.candidate_version} ({result.family}, {moved}; "
        f"{result.start_reason or ('fine-tuned' if result.warm_start else 'from scratch')})\n"
        f"  production : {result.production_before or '-'} -> {result.production_after or '-'}\n"
        f"  reason     : {result.reason}\n"
        f"  test AUC   : {result.metrics.get('auc', float('nan')):.4f}"
    )
    return EXIT_OK
