"""Prefect's API for a command that runs flows, found or started at the front door.

Without a configured server Prefect starts a temporary API (a uvicorn subprocess) when the first
flow begins: the process first imports Prefect's whole server to do so (~2.7 s) and then waits for
it (~4 s on an idle 2-core box), after the flows, torch and PySpark have been imported. Here, as
the CLI's first act, the command attaches to the warm API the previous command left running
(:mod:`infra.prefect_runtime.warm_api`; started now if there is none) or, with ``HYBRIDFLOW_WARM_API=false``,
starts the same temporary subprocess, which boots while this process imports and the JVM starts;
:func:`prefect_api` waits for it (by then usually ready) and points Prefect at it.
"""

from __future__ import annotations

import atexit
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from infra import startup
from infra.child_processes import die_with_parent
from infra.prefect_runtime.database import configured_sqlite_file, seed_database, template_path

if TYPE_CHECKING:
    from infra.settings import HybridflowSettings

STARTUP_TIMEOUT_ENV = "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"
# what Prefect 3.9's SubprocessASGIServer sets for its temporary server (no UI)
TEMPORARY_SERVER_ENV = {
    "PREFECT_UI_ENABLED": "0",
    "PREFECT__SERVER_EPHEMERAL": "1",
    "PREFECT__SERVER_FINAL": "1",
}


class ApiProcess(Protocol):
    """The API a command's flows talk to: a :class:`TemporaryApi` or a warm one."""

    @property
    def url(self) -> str: ...

    def wait_ready(self, timeout_s: float) -> None: ...


_started: ApiProcess | None = None
_lock = threading.Lock()


class TemporaryApi:
    """One uvicorn subprocess serving Prefect's API on a free loopback port; it gets SIGTERM
    when this process dies, however it dies (:func:`infra.child_processes.die_with_parent`)."""

    def __init__(self, env: dict[str, str] | None = None) -> None:
        self._ready = False
        self._env = env if env is not None else server_env()
        self._launch()

    def _launch(self) -> None:
        self.port = free_loopback_port()
        self.process = subprocess.Popen(
            uvicorn_command(self.port), env=self._env, preexec_fn=die_with_parent()
        )

    @property
    def url(self) -> str:
        """The API's base URL."""
        return f"http://127.0.0.1:{self.port}/api"

    def wait_ready(self, timeout_s: float) -> None:
        """Block until ``/api/health`` answers 200; a server that exits or never answers is an
        error that says so (the port taken meanwhile: start again on another one)."""
        import httpx

        deadline = time.monotonic() + timeout_s
        with httpx.Client(timeout=2.0) as client:
            while not self._ready:
                code = self.process.poll()
                if code == 3:  # uvicorn: address already in use
                    self._launch()
                elif code is not None:
                    raise RuntimeError(f"Prefect's temporary API exited with code {code}")
                try:
                    self._ready = client.get(f"{self.url}/health").status_code == 200
                except httpx.TransportError:
                    pass
                if not self._ready:
                    if time.monotonic() > deadline:
                        raise RuntimeError(
                            f"Prefect's temporary API did not answer on {self.url} within "
                            f"{timeout_s:.0f} s ({STARTUP_TIMEOUT_ENV})"
                        )
                    time.sleep(0.05)

    def stop(self) -> None:
        """Terminate the subprocess (kill it after 5 s)."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def free_loopback_port() -> int:
    """A port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def uvicorn_command(port: int) -> list[str]:
    """The command Prefect runs for its temporary API, without importing Prefect's server."""
    import importlib.util

    spec = importlib.util.find_spec("prefect")
    if spec is None or spec.origin is None:
        raise RuntimeError("prefect is not installed")
    app_dir = Path(spec.origin).parent.parent
    return [
        sys.executable,
        "-m",
        "uvicorn",
        "--app-dir",
        str(app_dir),
        "--factory",
        "prefect.server.api.server:create_app",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--log-level",
        "error",
        "--lifespan",
        "on",
    ]


def server_env() -> dict[str, str]:
    """This process's environment plus the temporary server's switches."""
    return {**os.environ, **TEMPORARY_SERVER_ENV}


def api_configured() -> bool:
    """Whether Prefect already has an API: ``PREFECT_API_URL`` in the environment, the profile
    or the current settings context (a test harness), or this process's temporary API."""
    if os.environ.get("PREFECT_API_URL") or _started is not None:
        return True
    from prefect.settings import get_current_settings  # the profile may name one too

    return bool(get_current_settings().api.url)


def start_temporary_api(settings: HybridflowSettings | None = None) -> None:
    """Find or start this command's API now, once per process, unless an API is configured;
    returns without waiting for it to answer. With ``settings`` whose ``warm_api`` is on (the
    CLI passes its settings), the warm API of this Prefect home
    (:func:`infra.prefect_runtime.warm_api.attach`: reused, or started and left running for the
    next command); else a temporary subprocess, stopped when the process exits. A home without a
    database gets the installation's empty migrated one first
    (:mod:`infra.prefect_runtime.database`)."""
    global _started
    with _lock:
        if api_configured():
            return
        if settings is not None and settings.warm_api:
            from infra.prefect_runtime.warm_api import attach

            warm = attach(settings.warm_api_idle_seconds, startup_timeout_s())
            atexit.register(warm.release)
            _started = warm
            return
        seed_database(configured_sqlite_file(), template_path())
        temporary = TemporaryApi()
        atexit.register(temporary.stop)
        _started = temporary


def startup_timeout_s() -> float:
    """How long a command waits for its API to answer (``STARTUP_TIMEOUT_ENV``, default 120)."""
    return float(os.environ.get(STARTUP_TIMEOUT_ENV, "120"))


@contextmanager
def prefect_api() -> Iterator[None]:
    """Flows called inside the block talk to the configured API or, without one, to this
    process's temporary API (started now unless :func:`start_temporary_api` did it earlier),
    once it answers."""
    start_temporary_api()
    startup.mark("api_wait")
    if _started is None:
        startup.mark("api_ready")
        yield
        return
    from prefect.settings import temporary_settings

    _started.wait_ready(startup_timeout_s())
    startup.mark("api_ready")
    with temporary_settings(updates=own_api_settings(_started.url)):
        yield


def own_api_settings(url: str) -> dict:
    """Prefect's client settings for an API this process found or started at ``url``: that
    address; no UI is served, so no "View at" links to it (Prefect derives them from the API's
    URL); and, unless this environment turns the server's CSRF protection on, no CSRF token:
    Prefect makes a client per flow run, and each asked the server for a token first
    (``GET /csrf-token``, answered 422 by a server without the protection): 11 of the 119
    requests of a small ``hybridflow run``."""
    from prefect.settings import (
        PREFECT_API_URL,
        PREFECT_CLIENT_CSRF_SUPPORT_ENABLED,
        PREFECT_UI_URL,
        get_current_settings,
    )

    updates: dict = {PREFECT_API_URL: url, PREFECT_UI_URL: ""}
    if not get_current_settings().server.api.csrf_protection_enabled:
        updates[PREFECT_CLIENT_CSRF_SUPPORT_ENABLED] = False
    return updates
