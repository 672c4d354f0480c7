"""The API map (/docs, /redoc, /openapi.json) exists only when a setting turns it on."""

from __future__ import annotations

from infra.settings import ServingSettings
from infra.storage.store import LocalFolderStore
from serving.app import create_app
from serving.holder import ModelHolder
from serving.metrics import ServingMetrics


def _paths(tmp_path, **settings) -> set[str]:
    metrics = ServingMetrics()
    holder = ModelHolder(LocalFolderStore(tmp_path / "store"), metrics)
    app = create_app(holder, ServingSettings(**settings), metrics)
    while not hasattr(app, "routes"):  # the FastAPI app inside the middleware
        app = app.app
    return {getattr(route, "path", "") for route in app.routes}


def test_the_api_map_is_off_unless_asked_for(tmp_path):
    off = _paths(tmp_path)
    assert not off & {"/docs", "/redoc", "/openapi.json"}
    assert {"/health", "/predict"} <= off
    on = _paths(tmp_path, api_docs=True)
    assert {"/docs", "/redoc", "/openapi.json"} <= on
