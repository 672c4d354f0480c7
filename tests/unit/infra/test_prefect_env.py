"""Prefect defaults the CLI applies before Prefect loads."""

from __future__ import annotations

import os

from infra.prefect_env import configure_prefect_defaults

HEARTBEAT = "PREFECT_FLOWS_HEARTBEAT_FREQUENCY"


def test_heartbeats_only_where_a_server_may_watch_them(monkeypatch, tmp_path):
    monkeypatch.delenv(HEARTBEAT, raising=False)
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    configure_prefect_defaults(tmp_path)
    assert HEARTBEAT not in os.environ, "the ephemeral API needs no heartbeats"

    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:4200/api")
    configure_prefect_defaults(tmp_path)
    assert os.environ[HEARTBEAT] == "30"

    monkeypatch.setenv(HEARTBEAT, "45")
    configure_prefect_defaults(tmp_path)
    assert os.environ[HEARTBEAT] == "45", "the user's own setting wins"
