"""Model refresh policy: when new data asks for a refresh, which horizon a refresh trains for,
and the operator's forced promotion.

The refresh itself reuses the pipeline's stages (validate -> features -> preprocess -> train);
the train stage fine-tunes from production when its features match and applies the gate (the
champion against production on the measure it was chosen by, :mod:`tasks.ml.gate`). What is left here is the part only a refresh has.
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import Literal

from pydantic import BaseModel

from infra.errors import HybridflowInputError
from infra.storage.registry import AliasRecord, ModelManifest, ModelRegistry
from tasks.reporting.records import StageReport, TrainResult

log = logging.getLogger(__name__)
PromoteMode = Literal["if-better", "always"]
RefreshTrigger = Literal["manual", "schedule", "drift", "new-data"]
RefreshReason = Literal["drift", "new-data"]


class RefreshDecision(BaseModel):
    """Whether a pipeline run's data asks for a model refresh, and why (None: skipped)."""

    reason: RefreshReason | None
    explanation: str
    new_data: bool
    production_version: str | None
    production_age_hours: float | None
    max_production_age_hours: float


def production_age_hours(alias: AliasRecord | None, now: dt.datetime) -> float | None:
    """Hours since production last moved (None before the first promotion)."""
    if alias is None or not alias.history:
        return None
    return max((now - alias.history[-1].at).total_seconds() / 3600.0, 0.0)


def refresh_decision(
    *,
    drifted: bool,
    new_data: bool,
    alias: AliasRecord | None,
    now: dt.datetime,
    max_age_hours: float,
) -> RefreshDecision:
    """Drift asks for a refresh; so does new data when production is older than
    ``max_age_hours``; anything else skips one (drift first: one reason per run)."""
    age = production_age_hours(alias, now)
    stale = age is not None and age > max_age_hours
    if drifted:
        reason: RefreshReason | None = "drift"
        why = "the data drifted from production's training data"
    elif new_data and stale:
        reason = "new-data"
        why = f"new data and production is {age:.1f}h old (> {max_age_hours:g}h)"
    else:
        reason = None
        why = _skipped_because(new_data, age, max_age_hours)
    return RefreshDecision(
        reason=reason,
        explanation=why,
        new_data=new_data,
        production_version=alias.version if alias else None,
        production_age_hours=age,
        max_production_age_hours=max_age_hours,
    )


def _skipped_because(new_data: bool, age: float | None, max_age_hours: float) -> str:
    if age is None:
        return "no production model to refresh"
    if not new_data:
        return "no drift and no new data"
    return f"no drift and production is {age:.1f}h old (<= {max_age_hours:g}h)"


class RefreshResult(BaseModel):
    """What a refresh produced and whether production moved."""

    run_id: str
    as_of: dt.date
    horizon_days: int
    candidate_version: str
    production_before: str | None
    production_after: str | None
    warm_start: bool = False
    family: str = "mlp"
    start_reason: str = ""
    promoted: bool
    forced: bool
    reason: str
    metrics: dict[str, float]
    stages: list[StageReport]
    seconds: float
    trigger: str = "manual"
    trigger_reason: str | None = None


def production_manifest(registry: ModelRegistry) -> ModelManifest | None:
    """The manifest production points at, or None before the first promotion."""
    record = registry.alias()
    return registry.get(record.version) if record else None


def require_production(production: ModelManifest | None) -> ModelManifest:
    """The production manifest a refresh fine-tunes; HybridflowInputError before any pipeline run
    has promoted one (a refresh schedule firing on a fresh stack does nothing)."""
    if production is None:
        raise HybridflowInputError(
            "no production model to refresh yet: run the pipeline first "
            "(hybridflow run, or the pipeline/pipeline deployment)"
        )
    return production


def refresh_horizon(requested: int | None, production: ModelManifest | None, default: int) -> int:
    """The horizon to train for: as asked, else production's (a refresh must not change what
    the score means), else the configured default."""
    if requested is not None:
        return requested
    if production is not None and production.horizon_days:
        return production.horizon_days
    return default


def apply_promotion_mode(
    registry: ModelRegistry, trained: TrainResult, mode: PromoteMode
) -> tuple[bool, bool, str]:
    """``(promoted, forced, reason)``: the gate's verdict, or with ``always`` an operator's
    promotion of a candidate the gate kept out (compare-and-swap against the production the
    gate saw, so a concurrent promotion is never overwritten)."""
    if trained.promoted or mode == "if-better":
        return trained.promoted, False, trained.decision_reason
    if mode != "always":
        raise HybridflowInputError(f"promote must be 'if-better' or 'always', not {mode!r}")
    reason = f"forced by operator (promote=always); gate said: {trained.decision_reason}"
    registry.set_alias(trained.model_version, reason, expected_version=trained.production_version)
    log.warning("model %s forced into production: %s", trained.model_version, reason)
    return True, True, reason
