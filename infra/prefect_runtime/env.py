"""Prefect defaults for a project-local setup; applied before Prefect is imported."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

HEARTBEAT_ENV = "PREFECT_FLOWS_HEARTBEAT_FREQUENCY"


def configure_prefect_defaults(base: Path | None = None) -> None:
    """Keep Prefect's state inside the project and its logs readable; never override the user."""
    base = (base or Path.cwd()) / ".hybridflow"
    os.environ.setdefault("PREFECT_HOME", str(base / "prefect"))
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_LOGGING_EXTRA_LOGGERS", "cli,flows,tasks,infra,serving")
    os.environ.setdefault("PREFECT_SERVER_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("PREFECT_LOGGING_LOG_PRINTS", "false")
    os.environ.setdefault("PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW", "ignore")
    # the ephemeral API needs ~10 s on an idle 2-core box; give a busy one room
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
    if os.environ.get("PREFECT_API_URL"):
        # a server's crash detection (hybridflow up) expects a heartbeat at least this often
        # (Prefect's default: 180 s); without a server see heartbeats_only_for_a_server
        os.environ.setdefault(HEARTBEAT_ENV, "30")
    Path(os.environ["PREFECT_HOME"]).mkdir(parents=True, exist_ok=True)


@contextmanager
def heartbeats_only_for_a_server() -> Iterator[None]:
    """No flow-run heartbeats inside the block unless ``PREFECT_API_URL`` names a server (or the
    user set the frequency): with the ephemeral API nobody watches them, and the end of every
    flow run waits up to 1 s for its heartbeat thread (3.2 s of a 46 s embedded run of 7 flow
    runs, py-spy). Environment variables cannot unset the frequency; a settings context can."""
    if os.environ.get("PREFECT_API_URL") or os.environ.get(HEARTBEAT_ENV):
        yield
        return
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

    with temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
        yield
