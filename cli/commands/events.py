"""``hybridflow events watch|export``: the events log's new segments announced to Prefect, so the
model-refresh triggers fire from events taken by ``POST /events``; and copied into an events
folder, so a batch run reads them with the original events."""

from __future__ import annotations

import argparse
from pathlib import Path

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
    watch.add_argument(
        "--into",
        type=Path,
        default=None,
        help="an events folder: export new segments into its events-log/ first (in its files' "
        "schema) and name it in the event, so a refresh reads the original and streamed events",
    )
    watch.set_defaults(handler=run_watch)
    export = actions.add_parser(
        "export",
        help="copy the log's segments into <events folder>/events-log/ (in its files' schema), "
        "so hybridflow run --events <events folder> reads the original events and the log",
    )
    export.add_argument("--into", type=Path, required=True, help="the events folder")
    export.set_defaults(handler=run_export)


def run_watch(args: argparse.Namespace) -> int:
    """Announce new segments once, or every ``--interval`` seconds until interrupted."""
    from infra.prefect_runtime.api import api_configured

    if not api_configured():
        raise HybridflowInputError(
            "hybridflow events watch sends events to a Prefect server: set PREFECT_API_URL "
            "(the server of hybridflow up, see hybridflow status)"
        )
    from flows.events_log import announce_landed_segments, watch_landed_segments
    from infra.settings import get_settings
    from infra.storage.store import open_store

    settings = get_settings()
    store = open_store(settings.store)
    max_age = settings.refresh.max_production_age_hours
    into = args.into.expanduser().resolve() if args.into else None
    if args.once:
        landed = announce_landed_segments(store, max_age, into=into)
        print(landed.model_dump_json() if landed else "no new segments")
        return EXIT_OK
    watch_landed_segments(store, max_age, args.interval, into)
    return EXIT_OK


def run_export(args: argparse.Namespace) -> int:
    """Copy the segments the events folder lacks; print how many."""
    from infra.settings import get_settings
    from infra.storage.events_log import EventsLog, export_into
    from infra.storage.store import open_store

    folder = args.into.expanduser().resolve()
    written = export_into(EventsLog(open_store(get_settings().store)), folder)
    print(f"{len(written)} new segment(s) in {folder / 'events-log'}")
    return EXIT_OK
