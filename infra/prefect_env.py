"""Prefect defaults for a project-local setup; applied before Prefect is imported."""

from __future__ import annotations

import os
from pathlib import Path


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
        # a server's crash detection (hybridflow up) expects a heartbeat at least this often.
        # Not for the ephemeral API, which nobody watches: every flow run's end waits up to 1 s
        # for its heartbeat thread (about 3 s of a 46 s embedded run, 7 flow runs).
        os.environ.setdefault("PREFECT_FLOWS_HEARTBEAT_FREQUENCY", "30")
    Path(os.environ["PREFECT_HOME"]).mkdir(parents=True, exist_ok=True)
