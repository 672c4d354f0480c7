"""After a pipeline run: the drift check, whether the data asks for a refresh, and the events.

The pipeline calls :func:`signal_refresh` last. It runs the ``drift`` flow on the features the
run published (against the model that scored them), decides with
:func:`tasks.policy.refresh.refresh_decision` whether a refresh is due, and emits
``hybridflow.drift.detected`` on drift, ``hybridflow.model.promoted`` when the run moved
production and ``hybridflow.events.landed`` always, last. The deployment triggers of
``model-refresh`` (prefect.yaml) start the refresh; nothing here calls it.
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

from flows.events import drift_detected, emit, events_landed, model_promoted
from flows.params import ResolvedRun
from infra.storage.registry import ModelRegistry
from tasks.data.drift_records import DriftReport
from tasks.policy.refresh import RefreshDecision, refresh_decision
from tasks.reporting.records import PipelineSummary

log = logging.getLogger(__name__)


def signal_refresh(
    run: ResolvedRun, summary: PipelineSummary, events: str, fingerprint: str
) -> tuple[DriftReport | None, RefreshDecision, dict[str, Any]]:
    """The run's drift report (None when the check failed), the refresh decision, and the
    ``drift`` entry of the run summary (the events' ids included)."""
    report, error = _check_drift(run, summary)
    validate = next((s for s in summary.stages if s.name == "validate"), None)
    decision = refresh_decision(
        drifted=bool(report and report.drifted),
        new_data=not (validate and validate.cached),
        alias=ModelRegistry(run.store).alias(),
        now=dt.datetime.now(dt.UTC),
        max_age_hours=run.settings.refresh.max_production_age_hours,
    )
    emitted: dict[str, str | None] = {}
    if report is not None and report.drifted:
        emitted["drift"] = emit(drift_detected(report, events, fingerprint, _status_line(report)))
    if summary.promoted:
        emitted["promoted"] = emit(
            model_promoted(
                summary.model_version,
                _previous(run, summary.model_version),
                summary.metrics,
                summary.promotion_reason,
                {"trigger": "pipeline", "run_id": summary.run_id},
            )
        )
    # last, so that whoever sees it can rely on the run's other events having been sent
    emitted["landed"] = emit(
        events_landed(events, fingerprint, summary.as_of, summary.rows_read, decision)
    )
    log.info("refresh %s: %s", decision.reason or "skipped", decision.explanation)
    entry = drift_entry(report, error, decision) | {"events": emitted}
    return report, decision, entry


def drift_entry(
    report: DriftReport | None, error: str | None, decision: RefreshDecision
) -> dict[str, Any]:
    """The ``drift`` entry of the run summary JSON."""
    refresh = {"reason": decision.reason or "skipped", "explanation": decision.explanation}
    if report is None:
        return {"status": "error", "error": error, "refresh": refresh}
    return {
        "status": report.status,
        "as_of": report.as_of.isoformat(),
        "model_version": report.model_version,
        "drifted": {f"{r.feature} {r.measure}": r.value for r in report.drifted},
        "measures": len(report.rows),
        "refresh": refresh,
    }


def _status_line(report: DriftReport) -> str:
    from tasks.stages.drift import drift_status_line

    return drift_status_line(report)


def _check_drift(run: ResolvedRun, summary: PipelineSummary) -> tuple[DriftReport | None, str]:
    """The drift flow on this run's features and predictions; a failed check is logged and
    reported in the summary, but the run's outputs stand."""
    from flows.drift import DriftParams, drift_flow  # torch and the scorer: after the stages

    state = drift_flow(
        DriftParams(
            as_of=summary.as_of,
            model_version=summary.scored_with,
            run_id=summary.run_id,
            store=run.store.uri,
        ),
        return_state=True,
    )
    if state.is_completed():
        return state.result(), ""
    message = state.message or state.name
    log.warning("drift check failed (the run's outputs stand): %s", message)
    return None, message


def _previous(run: ResolvedRun, version: str) -> str | None:
    """The version production pointed at before ``version`` was promoted."""
    alias = ModelRegistry(run.store).alias()
    history = alias.history if alias else []
    versions = [change.version for change in history]
    if version in versions:
        i = len(versions) - 1 - versions[::-1].index(version)
        return versions[i - 1] if i > 0 else None
    return None
