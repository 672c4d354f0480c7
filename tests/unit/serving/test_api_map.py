"""The API map (/docs, /redoc, /openapi.json) exists only when a setting turns it on, and then
describes the request bodies the endpoint really takes."""

from __future__ import annotations

import json

import pytest
from jsonschema import Draft202012Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from infra.settings import ServingSettings
from infra.storage.store import LocalFolderStore
from serving.app import create_app
from serving.holder import ModelHolder
from serving.metrics import ServingMetrics
from serving.online.ingest import IngestError, parse_events
from serving.schemas import PredictRequest


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


def _api_map(tmp_path) -> dict:
    metrics = ServingMetrics()
    holder = ModelHolder(LocalFolderStore(tmp_path / "store"), metrics)
    app = create_app(holder, ServingSettings(api_docs=True), metrics)
    while not hasattr(app, "routes"):
        app = app.app
    return app.openapi()


def _validator(doc: dict, component: str) -> Draft202012Validator:
    resource = Resource.from_contents(doc, default_specification=DRAFT202012)
    registry = Registry().with_resource("urn:api", resource)
    return Draft202012Validator(
        {"$ref": f"urn:api#/components/schemas/{component}"}, registry=registry
    )


def test_the_api_map_describes_the_bodies_predict_and_events_take(tmp_path):
    """FastAPI alone leaves the two plain routes out; the map has them, and its schemas take
    the bodies the endpoint takes and refuse what it refuses."""
    doc = _api_map(tmp_path)
    predict = doc["paths"]["/predict"]["post"]
    events = doc["paths"]["/events"]["post"]
    assert set(predict["requestBody"]["content"]) == {"application/json"}
    assert set(events["requestBody"]["content"]) == {
        "application/json",
        "application/vnd.apache.arrow.stream",
        "application/vnd.apache.arrow.file",
    }
    assert events["security"] == [{"ingestToken": []}]
    error = doc["components"]["schemas"]["Error"]
    assert error["required"] == ["detail", "errors"]
    assert {"413", "415", "422"} <= set(predict["responses"]) and "401" in events["responses"]
    request = _validator(doc, "PredictRequest")
    for good in (
        {"customer_id": "c000123"},
        {"customer_id": 123},
        {"features": {"recency_days": 3.0}},
        {"items": [{"customer_id": "c1"}, {"features": {"x": 1}}]},
    ):
        assert request.is_valid(good), good
        PredictRequest.model_validate(good)
    for bad in ({"customer_id": "c1", "colour": 1}, {"customer_id": True}, {"items": [{"x": 1}]}):
        assert not request.is_valid(bad), bad
    event = _validator(doc, "Event")
    for good in (
        {"customer_id": "c1", "event_time": "2026-01-05T10:31:02Z", "amount": 42.5},
        {"customer_id": 7, "event_time": 1767609062000, "amount": 0, "event_type": "view"},
    ):
        assert event.is_valid(good), good
        parse_events(json.dumps([good]).encode(), "application/json")
    for bad in (
        {"customer_id": "c1", "event_time": "2026-01-05", "amount": "1"},
        {"customer_id": "c1", "event_time": "2026-01-05"},
        {"customer_id": "c1", "event_time": "2026-01-05", "amount": 1, "colour": "red"},
    ):
        assert not event.is_valid(bad), bad
        with pytest.raises(IngestError):
            parse_events(json.dumps([bad]).encode(), "application/json")
