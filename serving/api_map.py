"""The API map (``/openapi.json``, shown by ``/docs`` and ``/redoc``) with the request bodies
``/predict`` and ``/events`` really take: both are plain routes that parse their own bodies (no
FastAPI dependency machinery per request), so FastAPI alone would leave them out."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from serving.bodies import IPC_FILE_MEDIA_TYPE, IPC_STREAM_MEDIA_TYPE, JSON_MEDIA_TYPE
from serving.online.ingest import event_json_schema
from serving.schemas import PredictRequest

REF = "#/components/schemas/{model}"
ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "detail": {"type": "string", "description": "every problem as 'field: message; ...'"},
        "errors": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"field": {"type": "string"}, "message": {"type": "string"}},
                "required": ["field", "message"],
            },
        },
    },
    "required": ["detail", "errors"],
}
PREDICT_ERRORS = {
    "413": "more items than max_batch_items, or a body over max_body_bytes",
    "415": "a Content-Type or Content-Encoding that is not JSON (gzip and deflate are taken)",
    "422": "malformed JSON, a wrong type, an unknown or missing field or feature",
    "404": "an unknown customer",
    "503": "no model loaded yet",
}
EVENTS_ERRORS = {
    "401": "no bearer token",
    "403": "a wrong token, or none configured (HYBRIDFLOW_SERVE__INGEST__TOKEN)",
    "409": "an Idempotency-Key used before for a different body",
    "413": "a body over ingest.max_body_bytes (decompressed)",
    "415": "a Content-Type other than JSON or Arrow IPC",
    "422": "a malformed body, an unknown or missing column, a wrong type, or bad rows (each named)",
    "503": "the online state is off or seeding",
}


def _answers(ok: dict[str, Any], errors: dict[str, str]) -> dict[str, Any]:
    error = {"application/json": {"schema": {"$ref": REF.format(model="Error")}}}
    out: dict[str, Any] = {"200": {"description": "done", "content": {"application/json": ok}}}
    out |= {status: {"description": why, "content": error} for status, why in errors.items()}
    return out


def api_map(app: FastAPI) -> dict[str, Any]:
    """FastAPI's map of its own routes, plus ``POST /predict`` and ``POST /events``."""
    if app.openapi_schema:
        return app.openapi_schema
    schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
    predict = PredictRequest.model_json_schema(ref_template=REF)
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    components.update(predict.pop("$defs", {}))
    components["PredictRequest"] = predict
    components["Event"] = event_json_schema()
    components["Error"] = ERROR_SCHEMA
    schema.setdefault("components", {})["securitySchemes"] = {
        "ingestToken": {"type": "http", "scheme": "bearer"}
    }
    arrow = {"schema": {"type": "string", "format": "binary"}}
    schema["paths"]["/predict"] = {
        "post": {
            "summary": "Score customers by id, or raw feature vectors",
            "operationId": "predict",
            "requestBody": {
                "required": True,
                "content": {
                    JSON_MEDIA_TYPE: {"schema": {"$ref": REF.format(model="PredictRequest")}}
                },
            },
            "responses": _answers({"schema": {"type": "object"}}, PREDICT_ERRORS),
        }
    }
    schema["paths"]["/events"] = {
        "post": {
            "summary": "Append a batch of events to the events log and apply it, or refuse it whole",
            "operationId": "events",
            "security": [{"ingestToken": []}],
            "parameters": [
                {
                    "name": "Idempotency-Key",
                    "in": "header",
                    "required": False,
                    "schema": {"type": "string"},
                    "description": "the batch's segment id (default: the body's sha256)",
                }
            ],
            "requestBody": {
                "required": True,
                "content": {
                    JSON_MEDIA_TYPE: {
                        "schema": {"type": "array", "items": {"$ref": REF.format(model="Event")}}
                    },
                    IPC_STREAM_MEDIA_TYPE: arrow,
                    IPC_FILE_MEDIA_TYPE: arrow,
                },
            },
            "responses": _answers({"schema": {"type": "object"}}, EVENTS_ERRORS),
        }
    }
    app.openapi_schema = schema
    return schema
