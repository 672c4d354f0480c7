"""`hybridflow up` starts `hybridflow events watch` on the stack's store and server (recorded as
a worker: `down` stops it first, a new store replaces it); the command refuses to run without a
Prefect server to send events to."""

from __future__ import annotations

import sys

from cli.main import main
from infra.settings import HybridflowSettings
from infra.stack import lifecycle, services
from infra.stack.processes import ProcessRecord, is_alive, kill_tree

NEVER_READY = [sys.executable, "-c", "import time; time.sleep(600)"]


def test_up_starts_the_watcher_once_with_the_stacks_store_and_server(tmp_path, monkeypatch):
    settings = HybridflowSettings(stack_dir=tmp_path / "stack", store=str(tmp_path / "store"))
    state = lifecycle.StackState(
        api_url="http://127.0.0.1:4200/api",
        ui_url="",
        project_dir=str(tmp_path),
        events=str(lifecycle.demo_events_dir(settings)),
        store="s3://hf-stack/store",
        s3_endpoint="http://127.0.0.1:9000",
    )
    seen: list[tuple[list[str], dict[str, str]]] = []
    real_launch = lifecycle.launch

    def recording_launch(key, command, env, *args, **kwargs) -> ProcessRecord:
        seen.append((command, env))
        return real_launch(key, NEVER_READY, env, *args, **kwargs)

    monkeypatch.setattr(lifecycle, "launch", recording_launch)
    base = {"PREFECT_API_URL": state.api_url}
    lines: list[str] = []
    try:
        lifecycle._ensure_events_watcher(settings, state, base, lines)
        lifecycle._ensure_events_watcher(settings, state, base, lines)  # idempotent
        record = state.processes["worker-events-watch"]
        assert is_alive(record)
    finally:
        for record in state.processes.values():
            kill_tree(record)
    ((command, env),) = seen
    into = lifecycle.demo_events_dir(settings)
    assert command == services.events_watch_command(into)
    assert command[-6:] == ["events", "watch", "--interval", "5", "--into", str(into)]
    assert env["HYBRIDFLOW_STORE"] == "s3://hf-stack/store"
    assert env["PREFECT_API_URL"] == state.api_url
    assert env["AWS_ENDPOINT_URL"] == "http://127.0.0.1:9000"
    assert lines[0].startswith("started the events log's watcher")
    assert lines[1].startswith("events watcher already running")


def test_the_watcher_needs_a_prefect_server(monkeypatch, capsys):
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    from infra.prefect_runtime import api as prefect_api

    monkeypatch.setattr(prefect_api, "api_configured", lambda: False)
    assert main(["events", "watch", "--once"]) == 2
    assert "set PREFECT_API_URL" in capsys.readouterr().err


def test_a_folder_of_your_events_is_not_written_into(tmp_path, monkeypatch):
    settings = HybridflowSettings(stack_dir=tmp_path / "stack", store=str(tmp_path / "store"))
    state = lifecycle.StackState(
        api_url="", ui_url="", project_dir=str(tmp_path), events=str(tmp_path / "mine"), store=""
    )
    commands = []
    real_launch = lifecycle.launch

    def recording_launch(key, command, env, *args, **kwargs) -> ProcessRecord:
        commands.append(command)
        return real_launch(key, NEVER_READY, env, *args, **kwargs)

    monkeypatch.setattr(lifecycle, "launch", recording_launch)
    try:
        lifecycle._ensure_events_watcher(settings, state, {}, [])
    finally:
        for record in state.processes.values():
            kill_tree(record)
    assert commands == [services.events_watch_command()]
    assert "--into" not in commands[0]
