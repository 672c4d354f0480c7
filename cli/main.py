"""``hybridflow``: the command line front door, the top floor of the layers.

Each subcommand is a module of :mod:`cli.commands`; a handler imports what it runs (flows,
serving) when it runs, so ``hybridflow --help`` starts in a fraction of a second.
"""

from __future__ import annotations

import argparse
import atexit
import importlib
import logging
import os
import sys
import traceback
from collections.abc import Sequence
from typing import NoReturn

from cli.args import EXIT_BAD_INPUT, EXIT_FAILURE
from cli.commands import COMMAND_MODULES
from infra import startup
from infra.child_processes import exit_on_sigterm
from infra.errors import HybridflowInputError
from infra.prefect_runtime.env import configure_prefect_defaults, heartbeats_only_for_a_server

NOISY_LOGGERS = ("httpx", "httpcore", "py4j", "botocore", "urllib3", "s3transfer")


class OneLineErrorParser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line on stderr (the command and what is
    wrong with which argument, ``--help`` for the usage) and exit code 2, like bad input."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for every subcommand (subcommands get the same class)."""
    parser = OneLineErrorParser(
        prog="hybridflow", description="ML pipelines on the hardware that fits each stage."
    )
    parser.add_argument("--debug", action="store_true", help="show stack traces on errors")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


class _QuietCliLogs(logging.Filter):
    """Prefect logs a flow's exception with its traceback; for input errors the CLI's one line
    says it all, so the traceback is dropped (``--debug`` keeps it). The ephemeral API's start
    and stop notices are dropped too, so the CLI's own line stays the last one on stderr."""

    NOTICES = ("Starting temporary server", "Stopping temporary server", "See https://")

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str) and record.msg.startswith(self.NOTICES):
            return False
        if record.exc_info and isinstance(record.exc_info[1], HybridflowInputError):
            record.exc_info = None
            record.exc_text = None
        return True


def _install_traceback_filter() -> None:
    import prefect  # noqa: F401  - sets up Prefect's handlers, which get the filter too

    hide = _QuietCliLogs()
    loggers = [logging.getLogger()] + [
        logging.getLogger(name) for name in list(logging.root.manager.loggerDict)
    ]
    for logger in loggers:
        for handler in getattr(logger, "handlers", []):
            handler.addFilter(hide)


def main(argv: Sequence[str] | None = None) -> int:
    """Run a subcommand; exit 2 with one line on bad input, 1 on any other failure."""
    startup.begin()
    args = build_parser().parse_args(argv)
    exit_on_sigterm()  # SIGTERM unwinds through the exit handlers (the temporary API stops)
    configure_prefect_defaults()
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    for noisy in NOISY_LOGGERS:
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if not args.debug:
        _install_traceback_filter()
    try:
        with heartbeats_only_for_a_server():
            return args.handler(args)
    except HybridflowInputError as exc:
        if args.debug:
            traceback.print_exc()
        print(f"hybridflow: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except Exception as exc:  # the CLI's last line of defence: one line, exit 1
        if args.debug:
            traceback.print_exc()
        print(f"hybridflow: failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_FAILURE


def console_main() -> None:
    """The ``hybridflow`` console script: :func:`main`, then exit without tearing the interpreter
    down. Once the exit handlers ran (Prefect's log and event workers drained, the temporary API
    stopped, logs flushed), freeing torch's, PySpark's and Prefect's modules one by one only
    costs time: 1.3-1.7 s of every run on a 2-core box (py-spy: no Python frame left)."""
    exit_code = EXIT_FAILURE

    def exit_now() -> None:  # registered first, so it runs after every other exit handler
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(exit_code)

    atexit.register(exit_now)
    try:
        exit_code = main()
    except SystemExit as exc:
        exit_code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
        raise
    except KeyboardInterrupt:
        exit_code = 130
        raise
    sys.exit(exit_code)


if __name__ == "__main__":
    console_main()
