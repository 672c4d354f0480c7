"""``hybridflow serve``: the real-time scoring endpoint with hot model reload."""

from __future__ import annotations

import argparse
from pathlib import Path

from cli.args import EXIT_OK, port_number


def register(sub: argparse._SubParsersAction) -> None:
    """Add the subcommand."""
    p = sub.add_parser("serve", help="real-time scoring endpoint (hot-reloads production)")
    p.add_argument("--host", default=None, help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=port_number, default=None, help="default 8000; 0 = any free port")
    p.add_argument(
        "--port-file", type=Path, default=None, help="write the bound port here once listening"
    )
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Serve until interrupted."""
    from infra.settings import get_settings
    from serving.server import serve

    serve(get_settings(), host=args.host, port=args.port, port_file=args.port_file)
    return EXIT_OK
