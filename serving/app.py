"""The FastAPI app: ``/predict``, ``/events``, ``/health``, ``/ready``, ``/metrics``,
``/admin/reload``."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError
from starlette.exceptions import HTTPException

from infra.settings import ServingSettings
from serving.api_map import api_map
from serving.bodies import BodyProblem, body_format, unsupported_media
from serving.holder import ModelHolder, ServingState
from serving.metrics import ServingMetrics
from serving.middleware import LimitsAndMetrics
from serving.online.features import fresh_features, fresh_features_of_one
from serving.online.ingest import IngestError
from serving.online.service import OnlineFeatures, OnlineView, iso_time
from serving.schemas import PredictItem, PredictRequest, describe_validation_error

log = logging.getLogger(__name__)
UTF8_BOM = b"\xef\xbb\xbf"


class PredictError(Exception):
    """A request that cannot be scored, with its HTTP status and the field to blame."""

    def __init__(self, status: int, field: str, message: str) -> None:
        super().__init__(message)
        self.status, self.field, self.message = status, field, message


def error_response(status: int, problems: list[dict[str, str]], **extra: object) -> JSONResponse:
    """``{"detail": "field: message; ...", "errors": [...]}`` (and ``extra``)."""
    detail = "; ".join(f"{p['field']}: {p['message']}" for p in problems)
    return JSONResponse({"detail": detail, "errors": problems, **extra}, status_code=status)


def problem(status: int, field: str, message: str) -> JSONResponse:
    """An error answer about one field."""
    return error_response(status, [{"field": field, "message": message}])


@dataclass(frozen=True)
class FreshRows:
    """Items scored on the online state's features: their positions, their features (model
    order; a row per item) and the newest event those include (microseconds)."""

    items: list[int]
    values: np.ndarray | list[tuple[float, ...]]
    as_of: int


def fresh_rows(
    online: OnlineView | None, items: list[PredictItem], features: tuple[str, ...]
) -> FreshRows | None:
    """The features of the items whose customer the online state has, None without any."""
    if online is None:
        return None
    row_of = online.state.row_of
    found = {}
    for i, item in enumerate(items):
        if item.customer_id is not None and (row := row_of.get(item.customer_id)) is not None:
            found[i] = row
    if not found:
        return None
    if len(found) == 1:  # a single request's: no arrays around one row
        [(i, row)] = found.items()
        values, as_of = fresh_features_of_one(online.state, row, online.at_least_day, features)
        return FreshRows([i], [values], as_of)
    rows = np.fromiter(found.values(), dtype=np.int64, count=len(found))
    values, as_of = fresh_features(online.state, rows, online.at_least_day, features)
    return FreshRows(list(found), values, as_of)


def feature_matrix(
    state: ServingState,
    items: list[PredictItem],
    batch: bool,
    fresh: FreshRows | None = None,
) -> np.ndarray:
    """Raw features in the model's order, one row per item; PredictError naming the field.
    The items of ``fresh`` get its features, other customers the snapshot's."""
    served = state.model
    assert served is not None
    x = np.empty((len(items), len(served.features)), dtype=np.float32)
    done = set()
    if fresh is not None:
        if len(fresh.items) == 1:
            x[fresh.items[0]] = fresh.values[0]
        else:
            x[fresh.items] = fresh.values
        done = set(fresh.items)
    for i, item in enumerate(items):
        where = f"items[{i}]." if batch else ""
        if i in done:
            continue
        if item.customer_id is not None:
            snapshot = state.snapshot
            if snapshot is None or state.snapshot_columns is None:
                raise PredictError(
                    503, f"{where}customer_id", "no feature snapshot loaded: send 'features'"
                )
            row = snapshot.row_of.get(item.customer_id)
            if row is None:
                log_too = " nor in the events log" if fresh is not None else ""
                raise PredictError(
                    404,
                    f"{where}customer_id",
                    f"unknown customer {item.customer_id!r} "
                    f"(not in the feature snapshot as_of {snapshot.as_of}{log_too})",
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


def features_as_of(state: ServingState, fresh: FreshRows | None) -> str | None:
    """When the features of a customer id were taken: the newest event applied online, else
    the snapshot's cutoff (the end of its as-of day)."""
    if fresh is not None:
        return iso_time(fresh.as_of)
    if state.snapshot is not None:
        return f"{state.snapshot.as_of.isoformat()}T23:59:59.999999Z"
    return None


def bearer_refusal(authorization: str, token: str | None, disabled: str) -> BodyProblem | None:
    """401 without a bearer token (``WWW-Authenticate: Bearer``), 403 with a wrong one or when
    none is set (``disabled`` says which setting enables it); None for the right token."""
    if token is None:
        return BodyProblem(403, "authorization", disabled)
    scheme, _, given = authorization.partition(" ")
    if scheme.lower() != "bearer" or not given:
        return BodyProblem(
            401, "authorization", "bearer token required", {"WWW-Authenticate": "Bearer"}
        )
    if not hmac.compare_digest(given.encode(), token.encode()):
        return BodyProblem(403, "authorization", "wrong token")
    return None


def bearer_problem(request: Request, token: str | None, disabled: str) -> JSONResponse | None:
    """:func:`bearer_refusal` of a request as an answer; None when it carries the token."""
    refusal = bearer_refusal(request.headers.get("authorization", ""), token, disabled)
    if refusal is None:
        return None
    response = problem(refusal.status, refusal.field, refusal.message)
    response.headers.update(refusal.headers)
    return response


def route_problem(request: Request, exc: HTTPException, routes: list[str]) -> JSONResponse:
    """A routing refusal (404 no such route, 405 wrong method) in the endpoint's error shape,
    naming what exists; FastAPI's own answer is ``{"detail": "Not Found"}`` only."""
    path, method = request.url.path, request.method
    if exc.status_code == 404:
        field, message = "path", f"no route {path} (routes: {', '.join(routes)})"
    elif exc.status_code == 405:
        allowed = (exc.headers or {}).get("Allow", "")
        field, message = "method", f"{method} is not allowed on {path}: send {allowed}"
    else:
        field, message = "request", str(exc.detail)
    response = problem(exc.status_code, field, message)
    response.headers.update(exc.headers or {})
    return response


def _names(names: list[str], shown: int = 5) -> str:
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def create_app(
    holder: ModelHolder,
    settings: ServingSettings,
    metrics: ServingMetrics,
    online: OnlineFeatures | None = None,
):
    """The endpoint as an ASGI app (FastAPI wrapped in the limits-and-metrics middleware).

    Startup loads the production model and the newest snapshot, then a background task checks
    for new ones every ``poll_interval_s``; with ``online``, another keeps its state with the
    served snapshot and the events log every ``ingest.tail_interval_s``.
    """

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await asyncio.to_thread(holder.refresh)
        tasks = [asyncio.create_task(_poll(holder, settings.poll_interval_s))]
        if online is not None:
            interval = settings.ingest.tail_interval_s
            tasks.append(asyncio.create_task(_follow(online, holder, interval)))
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            if online is not None:
                await online.close()

    docs = settings.api_docs  # off unless HYBRIDFLOW_SERVE__API_DOCS: an API map for anyone
    app = FastAPI(
        title="hybridflow real-time scoring",
        lifespan=lifespan,
        docs_url="/docs" if docs else None,
        redoc_url="/redoc" if docs else None,
        openapi_url="/openapi.json" if docs else None,
    )
    if docs:
        app.openapi = lambda: api_map(app)  # type: ignore[method-assign]
    token = settings.admin_token.get_secret_value() if settings.admin_token else None
    ingest_token = settings.ingest.token.get_secret_value() if settings.ingest.token else None

    async def on_route_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        routes = [
            f"{'|'.join(sorted(getattr(r, 'methods', None) or ()))} {getattr(r, 'path', '')}"
            for r in app.routes
            if getattr(r, "include_in_schema", False) or r.path in ("/predict", "/events")
        ]
        return route_problem(request, exc, routes)

    async def on_crash(request: Request, exc: Exception) -> Response:
        # Starlette raises it again after this answer: uvicorn logs the traceback
        name = type(exc).__name__
        return problem(500, "server", f"internal error ({name}); the endpoint's log has it")

    app.add_exception_handler(HTTPException, on_route_error)
    app.add_exception_handler(Exception, on_crash)

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
        if online is not None:
            body["online"] = online.report()
        return JSONResponse(body, status_code=200 if state.model else 503)

    for path, probe in (("/health", health), ("/ready", ready)):  # HEAD: uptime checkers
        app.add_api_route(path, probe, methods=["HEAD"], include_in_schema=False)

    @app.get("/metrics")
    async def prometheus_metrics() -> Response:
        """Prometheus text format."""
        return Response(metrics.render(), media_type=metrics.content_type)

    async def predict(request: Request) -> Response:
        """Score one customer / one feature vector, or a batch of them (``items``).

        A plain Starlette route: the body is parsed and validated here in one pass, so FastAPI's
        dependency machinery (about 50 us a request) would add nothing."""
        started = time.perf_counter()
        content_type = request.headers.get("content-type", "")
        if body_format(content_type) != "json":
            refusal = unsupported_media(content_type, ("json",))
            return problem(refusal.status, refusal.field, refusal.message)
        try:
            body = (await request.body()).removeprefix(UTF8_BOM)  # Windows editors write one
            req = PredictRequest.model_validate_json(body)
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
        view = online.view(state.model.features) if online is not None else None
        fresh = fresh_rows(view, items, state.model.features)
        try:
            x = feature_matrix(state, items, batch, fresh)
        except PredictError as exc:
            return problem(exc.status, exc.field, exc.message)
        scores = state.model.score(x)
        latency_ms = round((time.perf_counter() - started) * 1000, 3)
        metrics.items.inc(len(items))
        version = state.model.version
        as_of = features_as_of(state, fresh) if any(i.customer_id for i in items) else None
        if not batch:
            out = {"score": float(scores[0]), "model_version": version, "latency_ms": latency_ms}
            if req.customer_id is not None:
                out["customer_id"] = req.customer_id
                out["features_as_of"] = as_of
            return JSONResponse(out)
        return JSONResponse(
            {
                "model_version": version,
                "latency_ms": latency_ms,
                **({"features_as_of": as_of} if as_of else {}),
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

    ingest_disabled = "ingestion is disabled: set HYBRIDFLOW_SERVE__INGEST__TOKEN"

    def events_guard(authorization: str) -> BodyProblem | None:
        """The token, checked by the middleware before the body is read: a client without
        it is answered at once (never 100 Continue) and never costs the endpoint its body."""
        return bearer_refusal(authorization, ingest_token, ingest_disabled)

    async def events(request: Request) -> Response:
        """Append a batch of events to the log and apply it (bearer token required): a JSON
        array, or an Arrow IPC stream; all of it, or nothing with the reasons."""
        if (refusal := bearer_problem(request, ingest_token, ingest_disabled)) is not None:
            return refusal
        if online is None or not settings.ingest.online:
            return problem(503, "online", "the online state is off on this endpoint")
        body = await request.body()
        content_type = request.headers.get("content-type", "")
        key = request.headers.get("idempotency-key")
        try:
            answer = await online.ingest(body, content_type, key)
        except IngestError as exc:
            return error_response(exc.status, exc.problems, **exc.extra)
        return JSONResponse(answer)

    app.add_route("/events", events, methods=["POST"])

    @app.post("/admin/reload")
    async def admin_reload(request: Request) -> JSONResponse:
        """Check the alias and snapshots now (bearer token required)."""
        disabled = "reload is disabled: set HYBRIDFLOW_SERVE__ADMIN_TOKEN"
        if (refusal := bearer_problem(request, token, disabled)) is not None:
            return refusal
        report = await asyncio.to_thread(holder.refresh, True)
        return JSONResponse(report.model_dump(mode="json"))

    return LimitsAndMetrics(
        app,
        metrics,
        settings.max_body_bytes,
        settings.body_timeout_s,
        route_body_bytes={"/events": settings.ingest.max_body_bytes},
        route_guards={("POST", "/events"): events_guard},
    )


async def _follow(online: OnlineFeatures, holder: ModelHolder, interval_s: float) -> None:
    """Keep the online state with the served snapshot and the events log."""
    try:
        await online.start()
    except Exception:  # started again on its first call
        log.exception("the ingest worker did not start")
    while True:
        try:
            await online.follow(holder.state.snapshot)
        except Exception:  # store down, unreadable segment: tried again next time
            log.exception("following the events log failed")
        await asyncio.sleep(interval_s)


async def _poll(holder: ModelHolder, interval_s: float) -> None:
    while True:
        await asyncio.sleep(interval_s)
        try:
            await asyncio.to_thread(holder.refresh)
        except Exception:  # refresh reports its own failures; never let the poller die
            log.exception("model refresh check failed")
