"""The Prefect events hybridflow emits and the labels its triggers match on.

Emitted inside a flow run, each event also carries that run's resources (flow run, flow,
deployment, work pool), so the UI's event feed links it to the run. The deployment triggers of
``model-refresh`` in ``prefect.yaml`` react to :data:`DRIFT_DETECTED` and to
:data:`EVENTS_LANDED` when its :data:`REFRESH_LABEL` says ``new-data``; a test holds the two
files together.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field
from typing import Any

from prefect.events import emit_event

from tasks.data.drift_records import DriftReport
from tasks.policy.refresh import RefreshDecision

log = logging.getLogger(__name__)

EVENTS_LANDED = "hybridflow.events.landed"
DRIFT_DETECTED = "hybridflow.drift.detected"
MODEL_PROMOTED = "hybridflow.model.promoted"
REFRESH_LABEL = "hybridflow.refresh.reason"  # drift | new-data | none
EVENTS_RESOURCE = "hybridflow.events"
DRIFT_RESOURCE = "hybridflow.drift"
MODEL_RESOURCE = "hybridflow.model"


@dataclass(frozen=True)
class EventSpec:
    """One event before it is sent: name, resource, related resources, payload."""

    name: str
    resource: dict[str, str]
    related: list[dict[str, str]] = field(default_factory=list)
    payload: dict[str, Any] = field(default_factory=dict)


def model_resource(version: str, role: str = "model") -> dict[str, str]:
    """A model version as a related resource."""
    return {
        "prefect.resource.id": f"{MODEL_RESOURCE}.{version}",
        "prefect.resource.role": role,
        "prefect.resource.name": version,
    }


def events_resource_id(fingerprint: str) -> str:
    """The resource id of an input data set (its fingerprint names it)."""
    return f"{EVENTS_RESOURCE}.{fingerprint[:16]}"


def events_landed(
    events: str, fingerprint: str, as_of: object, rows: int, decision: RefreshDecision
) -> EventSpec:
    """``hybridflow.events.landed``: a pipeline run read this input; the label
    :data:`REFRESH_LABEL` says whether the data asks for a refresh (``new-data``: production is
    older than the configured age)."""
    related = [model_resource(decision.production_version)] if decision.production_version else []
    return EventSpec(
        EVENTS_LANDED,
        {
            "prefect.resource.id": events_resource_id(fingerprint),
            "prefect.resource.name": events,
            REFRESH_LABEL: decision.reason or "none",
        },
        related,
        {
            "events": events,
            "fingerprint": fingerprint,
            "as_of": str(as_of),
            "rows": rows,
            **decision.model_dump(mode="json"),
        },
    )


def log_segments_landed(
    log_uri: str,
    first: int,
    last: int,
    segments: list[str],
    as_of: object,
    rows: int,
    decision: RefreshDecision,
) -> EventSpec:
    """``hybridflow.events.landed`` for segments ``first`` to ``last`` of the events log (the
    endpoints' accepted events): the same event a pipeline run emits for its input, its
    ``events`` the log's segments folder, its resource named by the segments' ids."""
    fingerprint = hashlib.sha256("\n".join(segments).encode()).hexdigest()
    spec = events_landed(log_uri, fingerprint, as_of, rows, decision)
    spec.payload.update(source="events-log", segments=[first, last])
    return spec


def drift_detected(
    report: DriftReport, events: str | None, fingerprint: str | None, reason: str
) -> EventSpec:
    """``hybridflow.drift.detected``: which measures drifted and by how much."""
    related = [model_resource(report.model_version)]
    if fingerprint:
        related.append(
            {
                "prefect.resource.id": events_resource_id(fingerprint),
                "prefect.resource.role": "data",
            }
        )
    return EventSpec(
        DRIFT_DETECTED,
        {
            "prefect.resource.id": f"{DRIFT_RESOURCE}.{report.run_id}",
            "prefect.resource.name": f"drift at {report.as_of}",
            REFRESH_LABEL: "drift",
        },
        related,
        {
            "events": events,
            "as_of": report.as_of.isoformat(),
            "model_version": report.model_version,
            "run_id": report.run_id,
            "drifted": {f"{r.feature} {r.measure}": r.value for r in report.drifted},
            "thresholds": {f"{r.feature} {r.measure}": r.threshold for r in report.drifted},
            "reason": reason,
        },
    )


def model_promoted(
    version: str,
    previous: str | None,
    metrics: dict[str, float],
    reason: str,
    cause: dict[str, str | None],
) -> EventSpec:
    """``hybridflow.model.promoted``: production moved to ``version``; ``cause`` says what ran
    (e.g. a refresh's trigger and the id of the event that started it)."""
    related = [model_resource(previous, "previous")] if previous else []
    if cause.get("trigger_event"):
        related.append(
            {
                "prefect.resource.id": f"prefect.event.{cause['trigger_event']}",
                "prefect.resource.role": "trigger",
            }
        )
    return EventSpec(
        MODEL_PROMOTED,
        {"prefect.resource.id": f"{MODEL_RESOURCE}.{version}", "prefect.resource.name": version},
        related,
        {"version": version, "previous": previous, "metrics": metrics, "reason": reason, **cause},
    )


def emit(spec: EventSpec) -> str | None:
    """Send one event; its id, or None when no Prefect API receives events here."""
    event = emit_event(
        spec.name, resource=spec.resource, related=spec.related, payload=spec.payload
    )
    if event is None:
        log.warning("event %s not emitted (no Prefect API to send it to)", spec.name)
        return None
    log.info("emitted %s (%s) %s", spec.name, spec.resource["prefect.resource.id"], event.id)
    return str(event.id)
