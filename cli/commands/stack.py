"""``hybridflow up | down | status``: the local Prefect stack for deployed mode."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import get_args

from cli.args import EXIT_FAILURE, EXIT_OK, port_number
from infra.settings import StackDatabase


def register(sub: argparse._SubParsersAction) -> None:
    """Add the subcommands."""
    p = sub.add_parser(
        "up", help="start a local Prefect server, cpu-pool/gpu-pool workers and the deployments"
    )
    p.add_argument(
        "--port", type=port_number, default=4200, help="Prefect server/UI port (127.0.0.1)"
    )
    p.add_argument("--s3", action="store_true", help="also start a local S3 server (moto) as store")
    p.add_argument(
        "--events", type=Path, default=None, help="default events of the pipeline deployment"
    )
    p.add_argument(
        "--demo-customers",
        type=int,
        default=20_000,
        help="size of the demo data generated when no --events is given",
    )
    p.add_argument("--no-deploy", action="store_true", help="skip `prefect deploy --all`")
    p.add_argument(
        "--schedules",
        action="store_true",
        help="deploy the pipeline and model-refresh schedules active (default: paused)",
    )
    p.add_argument(
        "--db",
        choices=get_args(StackDatabase),
        default=None,
        help="the Prefect server's database (default HYBRIDFLOW_STACK_DB: postgres)",
    )
    p.add_argument(
        "--spark-workers",
        type=int,
        default=None,
        help="Spark cluster workers (default HYBRIDFLOW_STACK_SPARK_WORKERS: 2; "
        "0 = no cluster, local[*] in the cpu-pool's flow runs)",
    )
    p.set_defaults(handler=run_up)
    p = sub.add_parser(
        "down", help="stop what `hybridflow up` started, and the warm Prefect API of `run`"
    )
    p.set_defaults(handler=run_down)
    p = sub.add_parser("status", help="show what `hybridflow up` started and whether it runs")
    p.set_defaults(handler=run_status)


def run_up(args: argparse.Namespace) -> int:
    """Start or complete the stack."""
    from infra.settings import get_settings
    from infra.stack.lifecycle import UpOptions, demo_events_dir, recorded_events, up
    from infra.stack.spark_cluster import spark_spec

    settings = get_settings()
    events = args.events or recorded_events(settings)
    if events is None:
        events = demo_events_dir(settings)
        if not events.exists():
            from tasks.data.demo_events import DemoDataParams, generate_demo_events

            generate_demo_events(DemoDataParams(customers=args.demo_customers), events)
            print(f"generated demo events ({args.demo_customers:,} customers) at {events}")
    options = UpOptions(
        events=events,
        port=args.port,
        s3=args.s3,
        deploy=not args.no_deploy,
        schedules=args.schedules,
        db=args.db or settings.stack_db,
        spark=spark_spec(settings, args.spark_workers),
    )
    print("\n".join(up(settings, options)), flush=True)
    return EXIT_OK


def run_down(args: argparse.Namespace) -> int:
    """Stop the stack, and the warm Prefect API the embedded commands share."""
    from infra.prefect_runtime.warm_api import stop_warm_api
    from infra.settings import get_settings
    from infra.stack.lifecycle import down

    print("\n".join([*down(get_settings()), stop_warm_api()]))
    return EXIT_OK


def run_status(args: argparse.Namespace) -> int:
    """Exit 0 when everything recorded runs, 1 otherwise."""
    from infra.settings import get_settings
    from infra.stack.lifecycle import status

    healthy, lines = status(get_settings())
    print("\n".join([*lines, warm_api_line()]))
    return EXIT_OK if healthy else EXIT_FAILURE


def warm_api_line() -> str:
    """The warm Prefect API of the embedded commands, if one runs (not part of the stack: it
    does not change `status`'s exit code)."""
    from infra.prefect_runtime.warm_api import running_record

    record = running_record()
    if record is None:
        return "warm Prefect API of `hybridflow run`: not running"
    return (
        f"warm Prefect API of `hybridflow run`: {record.url} (pid {record.pid}; stops after "
        f"{record.idle_seconds:.0f} s unused, or with `hybridflow down`)"
    )
