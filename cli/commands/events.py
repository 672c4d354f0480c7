"""``hybridflow events watch``: the events log's new segments announced to Prefect, so the
model-refresh triggers fire from events taken by ``POST /events``."""

from __future__ import annotations

import argparse

from cli.args import EXIT_OK
from infra.errors import HybridflowInputError


def register(sub: argparse._SubParsersAction) -> None:
    """Add the subcommand."""
    p = sub.add_parser("events", help="the events log the endpoints write (POST /events)")
    actions = p.add_subparsers(dest="action", required=True)
    watch = actions.add_parser(
        "watch",
        help="emit hybridflow.events.landed for new segments of the log to the Prefect server "
        "(PREFECT_API_URL), so the refresh triggers fire from streamed events",
    )
    watch.add_argument(
        "--interval", type=float, default=10.0, help="seconds between checks (default 10)"
    )
    watch.add_argument(
        "--once", action="store_true", help="announce what landed since the last time, then exit"
    )
    watch.set_defaults(handler=run_watch)


def run_watch(args: argparse.Namespace) -> int:
    """Announce new segments once, or every ``--interval`` seconds until interrupted."""
    from infra.prefect_api import api_configured

    if not api_configured():
        raise HybridflowInputError(
            "hybridflow events watch sends events to a Prefect server: set PREFECT_API_URL "
            "(the server of hybridflow up, see hybridflow status)"
        )
    from flows.events_log import announce_landed_segments, watch_landed_segments
    from infra.settings import get_settings
    from infra.store import open_store

    settings = get_settings()
    store = open_store(settings.store)
    max_age = settings.refresh.max_production_age_hours
    if args.once:
        landed = announce_landed_segments(store, max_age)
        print(landed.model_dump_json() if landed else "no new segments")
        return EXIT_OK
    watch_landed_segments(store, max_age, args.interval)
    return EXIT_OK
