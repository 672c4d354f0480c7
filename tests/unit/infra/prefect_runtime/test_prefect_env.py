"""Prefect defaults the CLI applies before Prefect loads, and heartbeats only for a server."""

from __future__ import annotations

import os

from infra.prefect_runtime.env import HEARTBEAT_ENV as HEARTBEAT
from infra.prefect_runtime.env import configure_prefect_defaults, heartbeats_only_for_a_server


def _frequency() -> int | None:
    from prefect.settings import get_current_settings

    return get_current_settings().flows.heartbeat_frequency


def test_heartbeats_only_where_a_server_may_watch_them(monkeypatch, tmp_path):
    monkeypatch.delenv(HEARTBEAT, raising=False)
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    configure_prefect_defaults(tmp_path)
    assert HEARTBEAT not in os.environ
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

    # Prefect's default, whatever context this test runs in (the session's harness has none)
    with temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: 180}):
        with heartbeats_only_for_a_server():
            assert _frequency() is None, "the ephemeral API: no heartbeat thread to wait for"
        assert _frequency() == 180, "only inside the block"

    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:4200/api")
    configure_prefect_defaults(tmp_path)
    assert os.environ[HEARTBEAT] == "30"
    with temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: 30}):
        with heartbeats_only_for_a_server():
            assert _frequency() == 30, "a server's crash detection needs them"

    monkeypatch.setenv(HEARTBEAT, "45")
    configure_prefect_defaults(tmp_path)
    assert os.environ[HEARTBEAT] == "45", "the user's own setting wins"
