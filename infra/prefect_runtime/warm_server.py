"""The warm Prefect API's process (:mod:`infra.prefect_runtime.warm_api`): Prefect's server app under uvicorn on
the socket its launcher bound, stopping itself when nobody needs it.

A watchdog thread checks, under the state folder's lock, every few seconds: when no command
holds a live lease and the server answered no request for ``--idle-seconds`` (or the record no
longer names this process: it was replaced or ``hybridflow down`` forgot it), it removes its
record and asks uvicorn to shut down. SIGTERM (``hybridflow down``) shuts it down as well.

Run as ``python -m infra.prefect_runtime.warm_server --fd N --state-dir DIR --idle-seconds S``.
"""

from __future__ import annotations

import argparse
import os
import socket
import threading
import time
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

from infra.prefect_runtime.warm_api import forget_record, live_leases, locked, read_record

Scope = MutableMapping[str, Any]
Asgi = Callable[
    [Scope, Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]], Awaitable[None]
]


class Activity:
    """When the server last got a request (monotonic seconds)."""

    def __init__(self) -> None:
        self.last = time.monotonic()

    def track(self, app: Asgi) -> Asgi:
        """``app`` with every HTTP request noted."""

        async def tracked(scope: Scope, receive: Any, send: Any) -> None:
            if scope["type"] == "http":
                self.last = time.monotonic()
            await app(scope, receive, send)

        return tracked


def should_stop(folder: Path, activity: Activity, idle_seconds: float, pid: int) -> bool:
    """Whether nobody needs this server any more; if so its record is removed (under the lock,
    so that no command takes a lease on it meanwhile)."""
    with locked(folder):
        if live_leases(folder, pid):
            return False
        record = read_record(folder)
        if record is not None and record.pid == pid:
            if time.monotonic() - activity.last < idle_seconds:
                return False
            forget_record(folder, pid)
        return True


def watch(server: Any, folder: Path, activity: Activity, idle_seconds: float) -> None:
    """Ask ``server`` to exit once :func:`should_stop` says so."""
    interval = min(5.0, max(0.2, idle_seconds / 4))
    while not server.should_exit:
        time.sleep(interval)
        if should_stop(folder, activity, idle_seconds, os.getpid()):
            server.should_exit = True


def main(argv: list[str] | None = None) -> None:
    """Serve Prefect's API on the inherited socket until nobody needs it."""
    parser = argparse.ArgumentParser(prog="python -m infra.prefect_runtime.warm_server")
    parser.add_argument("--fd", type=int, required=True, help="the listening socket's descriptor")
    parser.add_argument("--state-dir", type=Path, required=True)
    parser.add_argument("--idle-seconds", type=float, required=True)
    args = parser.parse_args(argv)

    import uvicorn
    from prefect.server.api.server import create_app

    sock = socket.socket(fileno=args.fd)
    activity = Activity()
    config = uvicorn.Config(
        activity.track(create_app()),
        lifespan="on",
        log_level="error",
        timeout_graceful_shutdown=5,
    )
    server = uvicorn.Server(config)
    threading.Thread(
        target=watch,
        args=(server, args.state_dir, activity, args.idle_seconds),
        name="idle-watchdog",
        daemon=True,
    ).start()
    try:
        server.run(sockets=[sock])
    finally:
        with locked(args.state_dir, wait=False) as held:
            if held:  # else whoever holds the lock is replacing or stopping this server
                forget_record(args.state_dir, os.getpid())


if __name__ == "__main__":
    main()
