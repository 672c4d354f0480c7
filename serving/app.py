"""The FastAPI app: ``/predict``, ``/health``, ``/ready``, ``/metrics``, ``/admin/reload``."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import time
from collections.abc import AsyncIterator

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError

from infra.settings import ServingSettings
from serving.holder import ModelHolder, ServingState
from serving.metrics import ServingMetrics
from serving.middleware import LimitsAndMetrics
from serving.schemas import PredictItem, PredictRequest, describe_validation_error

log = logging.getLogger(__name__)


class PredictError(Exception):
    """A request that cannot be scored, with its HTTP status and the field to blame."""

    def __init__(self, status: int, field: str, message: str) -> None:
        super().__init__(message)
        self.status, self.field, self.message = status, field, message


def error_response(status: int, problems: list[dict[str, str]]) -> JSONResponse:
    """``{"detail": "field: message; ...", "errors": [...]}``."""
    detail = "; ".join(f"{p['field']}: {p['message']}" for p in problems)
    return JSONResponse({"detail": detail, "errors": problems}, status_code=status)


def problem(status: int, field: str, message: str) -> JSONResponse:
    """An error answer about one field."""
    return error_response(status, [{"field": field, "message": message}])


def feature_matrix(state: ServingState, items: list[PredictItem], batch: bool) -> np.ndarray:
    """Raw features in the model's order, one row per item; PredictError naming the field."""
    served = state.model
    assert served is not None
    x = np.empty((len(items), len(served.features)), dtype=np.float32)
    for i, item in enumerate(items):
        where = f"items[{i}]." if batch else ""
        if item.customer_id is not None:
            snapshot = state.snapshot
            if snapshot is None or state.snapshot_columns is None:
                raise PredictError(
                    503, f"{where}customer_id", "no feature snapshot loaded: send 'features'"
                )
            row = snapshot.row_of.get(item.customer_id)
            if row is None:
                raise PredictError(
                    404,
                    f"{where}customer_id",
                    f"unknown customer {item.customer_id!r} "
                    f"(not in the feature snapshot as_of {snapshot.as_of})",
                )
            x[i] = snapshot.values[row, state.snapshot_columns]
        else:
            given = item.features or {}
            unknown = [k for k in given if k not in served.position]
            if unknown:
                raise PredictError(
                    422,
                    f"{where}features.{unknown[0]}",
                    f"unknown feature(s) {_names(unknown)} for model {served.version}",
                )
            missing = [f for f in served.features if f not in given]
            if missing:
                raise PredictError(
                    422,
                    f"{where}features.{missing[0]}",
                    f"missing feature(s) {_names(missing)} "
                    f"(model {served.version} needs all {len(served.features)})",
                )
            x[i] = [given[f] for f in served.features]
            if not np.isfinite(x[i]).all():
                name = served.features[int(np.argmin(np.isfinite(x[i])))]
                raise PredictError(422, f"{where}features.{name}", "out of float32 range")
    return x


def _names(names: list[str], shown: int = 5) -> str:
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def create_app(holder: ModelHolder, settings: ServingSettings, metrics: ServingMetrics):
    """The endpoint as an ASGI app (FastAPI wrapped in the limits-and-metrics middleware).

    Startup loads the production model and the newest snapshot, then a background task checks
    for new ones every ``poll_interval_s``.
    """

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await asyncio.to_thread(holder.refresh)
        poller = asyncio.create_task(_poll(holder, settings.poll_interval_s))
        try:
            yield
        finally:
            poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await poller

    app = FastAPI(title="hybridflow real-time scoring", lifespan=lifespan)
    token = settings.admin_token.get_secret_value() if settings.admin_token else None

    @app.get("/health")
    async def health() -> dict[str, str]:
        """The process is up."""
        return {"status": "ok"}

    @app.get("/ready")
    async def ready() -> JSONResponse:
        """200 once a model is loaded; 503 before."""
        state = holder.state
        body = {
            "status": "ready" if state.model else "not ready",
            "model_version": state.model.version if state.model else None,
            "features_as_of": state.snapshot.as_of.isoformat() if state.snapshot else None,
            "customers": state.snapshot.rows if state.snapshot else 0,
            "last_reload_error": holder.last_error,
        }
        return JSONResponse(body, status_code=200 if state.model else 503)

    @app.get("/metrics")
    async def prometheus_metrics() -> Response:
        """Prometheus text format."""
        return Response(metrics.render(), media_type=metrics.content_type)

    async def predict(request: Request) -> Response:
        """Score one customer / one feature vector, or a batch of them (``items``).

        A plain Starlette route: the body is parsed and validated here in one pass, so FastAPI's
        dependency machinery (about 50 us a request) would add nothing."""
        started = time.perf_counter()
        try:
            req = PredictRequest.model_validate_json(await request.body())
        except ValidationError as exc:
            return error_response(422, describe_validation_error(exc))
        state = holder.state  # read once: this request finishes on this model
        if state.model is None:
            return problem(503, "model", "no model loaded yet")
        items = req.as_items()
        batch = req.items is not None
        if len(items) > settings.max_batch_items:
            limit = settings.max_batch_items
            return problem(413, "items", f"{len(items)} items; at most {limit}")
        try:
            x = feature_matrix(state, items, batch)
        except PredictError as exc:
            return problem(exc.status, exc.field, exc.message)
        scores = state.model.score(x)
        latency_ms = round((time.perf_counter() - started) * 1000, 3)
        metrics.items.inc(len(items))
        version = state.model.version
        if not batch:
            out = {"score": float(scores[0]), "model_version": version, "latency_ms": latency_ms}
            if req.customer_id is not None:
                out["customer_id"] = req.customer_id
            return JSONResponse(out)
        return JSONResponse(
            {
                "model_version": version,
                "latency_ms": latency_ms,
                "items": [
                    {
                        "score": float(s),
                        "model_version": version,
                        "latency_ms": latency_ms,
                        **({"customer_id": it.customer_id} if it.customer_id is not None else {}),
                    }
                    for s, it in zip(scores, items, strict=True)
                ],
            }
        )

    app.add_route("/predict", predict, methods=["POST"])

    @app.post("/admin/reload")
    async def admin_reload(request: Request) -> JSONResponse:
        """Check the alias and snapshots now (bearer token required)."""
        if token is None:
            disabled = "reload is disabled: set HYBRIDFLOW_SERVE__ADMIN_TOKEN"
            return problem(403, "authorization", disabled)
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not given:
            response = problem(401, "authorization", "bearer token required")
            response.headers["WWW-Authenticate"] = "Bearer"
            return response
        if not hmac.compare_digest(given.encode(), token.encode()):
            return problem(403, "authorization", "wrong token")
        report = await asyncio.to_thread(holder.refresh, True)
        return JSONResponse(report.model_dump(mode="json"))

    return LimitsAndMetrics(app, metrics, settings.max_body_bytes, settings.body_timeout_s)


async def _poll(holder: ModelHolder, interval_s: float) -> None:
    while True:
        await asyncio.sleep(interval_s)
        try:
            await asyncio.to_thread(holder.refresh)
        except Exception:  # refresh reports its own failures; never let the poller die
            log.exception("model refresh check failed")
