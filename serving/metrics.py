"""Prometheus metrics of the endpoint, in a registry of its own (text format at ``/metrics``)."""

from __future__ import annotations

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.002,
    0.003,
    0.005,
    0.0075,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    1.0,
)
ROUTES = frozenset({"/predict", "/events", "/health", "/ready", "/metrics", "/admin/reload"})


class ServingMetrics:
    """Request counts and latency, what is being served, reloads and refused reloads."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "hybridflow_serving_requests",
            "HTTP requests by route and status",
            ["route", "status"],
            registry=r,
        )
        self.latency = Histogram(
            "hybridflow_serving_request_duration_seconds",
            "time from request start to the end of the response, by route",
            ["route"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.items = Counter(
            "hybridflow_serving_predictions", "items scored (a batch counts each item)", registry=r
        )
        self.model_info = Gauge(
            "hybridflow_serving_model_info",
            "model version being served (value 1)",
            ["version"],
            registry=r,
        )
        self.snapshot_info = Gauge(
            "hybridflow_serving_feature_snapshot_info",
            "feature snapshot being served (value = customers in it)",
            ["as_of"],
            registry=r,
        )
        self.reloads = Counter(
            "hybridflow_serving_model_reloads", "model versions swapped in", registry=r
        )
        self.reload_failures = Counter(
            "hybridflow_serving_model_reload_failures",
            "new model versions or snapshots refused (old one kept serving), by reason",
            ["kind", "reason"],
            registry=r,
        )
        self.dropped = Counter(
            "hybridflow_serving_dropped_requests",
            "requests not served: header_timeout, slow_headers (closed for a new connection), "
            "body_timeout (408), header_too_large (431), client_gone (closed mid-body, 499), "
            "client_limit, connection_limit (503), bad_request (400)",
            ["reason"],
            registry=r,
        )
        self.open_connections = Gauge(
            "hybridflow_serving_open_connections",
            "open connections by phase: waiting (for headers), active (a request), idle",
            ["phase"],
            registry=r,
        )
        self.idle_closed = Counter(
            "hybridflow_serving_idle_connections_closed",
            "kept-alive connections closed between requests to let a new connection in",
            registry=r,
        )
        self.model_loaded_at = Gauge(
            "hybridflow_serving_model_loaded_timestamp_seconds",
            "when the served model was swapped in (unix time)",
            registry=r,
        )
        self.events_ingested = Counter(
            "hybridflow_serving_events_ingested",
            "events sent to POST /events: accepted (appended to the log), refused (a bad batch, "
            "nothing applied), duplicate (a re-sent segment, not applied again)",
            ["result"],
            registry=r,
        )
        self.events_applied = Counter(
            "hybridflow_serving_events_applied",
            "events applied to the online state from the log (any replica's segments)",
            registry=r,
        )
        self.online_position = Gauge(
            "hybridflow_serving_events_log_position",
            "the last segment of the events log applied to the online state",
            registry=r,
        )
        self.online_lag = Gauge(
            "hybridflow_serving_events_log_lag_seconds",
            "seconds since this replica last had every segment of the log",
            registry=r,
        )
        self.online_customers = Gauge(
            "hybridflow_serving_online_customers", "customers in the online state", registry=r
        )
        self.online_bytes = Gauge(
            "hybridflow_serving_online_state_bytes",
            "bytes of the online state's arrays (allocated capacity included)",
            registry=r,
        )
        self.online_newest = Gauge(
            "hybridflow_serving_online_features_as_of_timestamp_seconds",
            "the newest event applied to the online state (unix time)",
            registry=r,
        )

    def observe(self, path: str, status: int, seconds: float) -> None:
        """Count one finished request (unknown paths share one label)."""
        route = path if path in ROUTES else "other"
        self.requests.labels(route, str(status)).inc()
        self.latency.labels(route).observe(seconds)

    def serving_model(self, version: str, loaded_at: float) -> None:
        """Record the version now served (only that one carries the label)."""
        self.model_info.clear()
        self.model_info.labels(version).set(1)
        self.model_loaded_at.set(loaded_at)

    def serving_snapshot(self, as_of: str, rows: int) -> None:
        """Record the feature snapshot now served."""
        self.snapshot_info.clear()
        self.snapshot_info.labels(as_of).set(rows)

    def render(self) -> bytes:
        """Everything in the Prometheus text exposition format."""
        return generate_latest(self.registry)
