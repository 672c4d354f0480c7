"""A refresh before any pipeline run has promoted a model (a refresh schedule firing on a fresh
stack): one clear error, exit 2, and nothing written to the store."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.integration


def test_refresh_without_a_production_model_refuses_and_writes_nothing(
    tmp_path, prefect_harness, monkeypatch, capsys
):
    from cli.main import main
    from infra.settings import get_settings

    store = tmp_path / "store"
    events = tmp_path / "events.csv"
    events.write_text("customer_id,event_time,amount\nc1,2025-01-01T00:00:00,1.0\n")
    monkeypatch.setenv("HYBRIDFLOW_STORE", str(store))
    get_settings.cache_clear()
    try:
        code = main(["refresh", "--events", str(events), "--as-of", "2025-12-31"])
    finally:
        get_settings.cache_clear()
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, err
    assert err[-1] == (
        "hybridflow: error: no production model to refresh yet: run the pipeline first "
        "(hybridflow run, or the pipeline/pipeline deployment)"
    )
    written = [p for p in store.rglob("*") if p.is_file()] if store.exists() else []
    assert written == [], written
