"""A trailing slash names the same route: ``POST /predict/`` is ``POST /predict`` (before: an
empty 307 that httpx and curl without ``-L`` showed as the answer), and ``/events/`` keeps
/events' token check and body limit."""

from __future__ import annotations

import asyncio

import httpx

from infra.settings import ServingSettings
from infra.storage.store import LocalFolderStore
from serving.app import create_app
from serving.holder import ModelHolder
from serving.metrics import ServingMetrics
from serving.middleware import unslashed


def test_unslashed_drops_trailing_slashes_only():
    assert unslashed({"path": "/predict/", "raw_path": b"/predict/"}) == {
        "path": "/predict",
        "raw_path": b"/predict",
    }
    assert unslashed({"path": "/events//"})["path"] == "/events"
    assert unslashed({"path": "/"})["path"] == "/"
    scope = {"path": "/health"}
    assert unslashed(scope) is scope


def _answers(tmp_path, requests: list[tuple[str, str, dict]]) -> list[httpx.Response]:
    metrics = ServingMetrics()
    holder = ModelHolder(LocalFolderStore(tmp_path / "store"), metrics)
    settings = ServingSettings(ingest={"token": "t0k", "max_body_bytes": 1024})
    app = create_app(holder, settings, metrics)

    async def send() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://x") as client:
            return [await client.request(m, url, **kw) for m, url, kw in requests]

    return asyncio.run(send())


def test_slashed_paths_are_served_as_their_routes(tmp_path):
    health, predict, no_token, too_big, metrics = _answers(
        tmp_path,
        [
            ("GET", "/health/", {}),
            ("POST", "/predict/", {"json": {"customer_id": "c1"}}),
            ("POST", "/events/", {"json": []}),
            (
                "POST",
                "/events/",
                {"content": b"[" + b" " * 2000 + b"]", "headers": {"Authorization": "Bearer t0k"}},
            ),
            ("GET", "/metrics/", {}),
        ],
    )
    assert health.status_code == 200 and health.json() == {"status": "ok"}
    assert predict.status_code == 503 and "no model loaded yet" in predict.json()["detail"]
    assert no_token.status_code == 401 and no_token.headers["www-authenticate"] == "Bearer"
    assert too_big.status_code == 413 and "larger than 1024 bytes" in too_big.json()["detail"]
    assert 'route="/events"' in metrics.text and 'route="/predict"' in metrics.text
