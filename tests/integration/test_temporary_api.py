"""Prefect's temporary API started by the CLI (infra.prefect_runtime.api): flows reach it, it stops, and a
server that dies or never answers is an error that says so."""

from __future__ import annotations

import sys

import pytest

import infra.prefect_runtime.api as prefect_api_module
from infra.prefect_runtime.api import TemporaryApi, prefect_api, start_temporary_api

pytestmark = pytest.mark.integration


@pytest.fixture
def no_api(monkeypatch, tmp_path):
    """No API configured anywhere, no temporary API started yet, a private PREFECT_HOME."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "prefect-home"))
    monkeypatch.setattr(prefect_api_module, "_started", None)
    with temporary_settings(updates={PREFECT_API_URL: None}):
        yield
    if prefect_api_module._started is not None:
        prefect_api_module._started.stop()


@pytest.mark.slow(reason="starts Prefect's temporary API (a uvicorn process) on a new home")
def test_a_home_seeded_with_the_installations_empty_database_serves_flows(no_api, tmp_path):
    """`make install` recorded the empty database; a new home starts from a copy of it, which
    Prefect accepts as it is (already at the newest migration)."""
    import sqlite3

    from prefect import flow

    from infra.prefect_runtime.database import configured_sqlite_file, template_path

    template = template_path()
    assert template.is_file(), (
        f"make install records {template}: python -m infra.prefect_runtime.database"
    )
    database = configured_sqlite_file()
    assert database == tmp_path / "prefect-home" / "prefect.db" and not database.exists()

    @flow(name="seeded-home-probe", persist_result=False)
    def probe() -> int:
        return 3

    start_temporary_api()
    assert database.exists(), "the home was not seeded before the server started"
    with prefect_api():
        assert probe() == 3
    prefect_api_module._started.stop()

    def migration(path):
        with sqlite3.connect(path) as db:
            return db.execute("SELECT version_num FROM alembic_version").fetchall()

    assert migration(database) == migration(template)


@pytest.mark.slow(reason="starts Prefect's temporary API (a uvicorn process) and runs flows on it")
def test_flows_inside_the_block_run_on_the_temporary_api(no_api):
    from prefect import flow, get_client
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker
    from prefect.settings import PREFECT_API_URL, PREFECT_UI_URL

    @flow(name="temporary-api-probe", persist_result=False)
    def probe() -> int:
        return 7

    start_temporary_api()
    api = prefect_api_module._started
    assert api is not None and api.process.poll() is None
    with prefect_api():
        assert PREFECT_API_URL.value() == api.url
        assert not PREFECT_UI_URL.value(), "no UI is served: no links to one"
        assert probe() == 7
        with get_client(sync_client=True) as client:
            runs = client.read_flow_runs()
    assert [r.name for r in runs if r.state and r.state.is_completed()], runs
    assert PREFECT_API_URL.value() is None, "the block's settings do not leak"

    start_temporary_api()
    assert prefect_api_module._started is api, "one temporary API per process"
    # the CLI stops the server at exit, after Prefect's log and event workers drained
    APILogWorker.drain_all()
    EventsWorker.drain_all()
    api.stop()
    assert api.process.poll() is not None


def test_nothing_starts_when_an_api_is_configured(no_api, monkeypatch):
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:9/api")
    start_temporary_api()
    assert prefect_api_module._started is None


def test_a_server_that_exits_is_reported_with_its_code(monkeypatch):
    monkeypatch.setattr(
        prefect_api_module, "uvicorn_command", lambda port: [sys.executable, "-c", "exit(7)"]
    )
    api = TemporaryApi()
    with pytest.raises(RuntimeError, match="temporary API exited with code 7"):
        api.wait_ready(timeout_s=30)


def test_a_server_that_never_answers_times_out_naming_the_setting(monkeypatch):
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    monkeypatch.setattr(prefect_api_module, "uvicorn_command", lambda port: sleeper)
    api = TemporaryApi()
    try:
        with pytest.raises(RuntimeError, match="did not answer .* within 1 s.*STARTUP_TIMEOUT"):
            api.wait_ready(timeout_s=1)
    finally:
        api.stop()
    assert api.process.poll() is not None
