"""``hybridflow jvm-archive``: record the JVM class archive Spark's JVMs start from."""

from __future__ import annotations

import argparse

from cli.args import EXIT_OK


def register(sub: argparse._SubParsersAction) -> None:
    """Add the subcommand."""
    p = sub.add_parser(
        "jvm-archive",
        help="record the JVM class archive Spark's JVMs start from (make install runs it)",
    )
    p.add_argument("--force", action="store_true", help="record it again even if it exists")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Record the archive (about 20 s) unless this installation has one; print its path."""
    from cli.class_archive import record_class_archive
    from infra.settings import get_settings

    print(record_class_archive(get_settings(), force=args.force))
    return EXIT_OK
