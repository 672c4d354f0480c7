"""Measured stage profiles and the throughput model the router fits to them.

Every stage run records one :class:`StageProfile` in the store
(``profiles/<stage>/<pool>/<time>-<id>.json``). Per (stage, pool) the router fits
``seconds = fixed + per_row * rows`` by least squares (or a pure rate with one size seen).
"""

from __future__ import annotations

import datetime as dt
import secrets

import numpy as np
from pydantic import BaseModel, Field

from infra.layout import profile_key, profiles_prefix
from infra.storage.store import ObjectStore


class StageProfile(BaseModel):
    """What one stage run measured."""

    stage: str
    pool: str
    device: str
    rows: int = Field(ge=0)
    model_params: int = 0
    seconds: float = Field(ge=0)
    peak_memory_mb: float | None = None
    run_id: str = ""
    recorded_at: dt.datetime = Field(default_factory=lambda: dt.datetime.now(dt.UTC))


class ThroughputModel(BaseModel):
    """``seconds = fixed_seconds + seconds_per_row * rows``, fitted to profiles."""

    stage: str
    pool: str
    fixed_seconds: float
    seconds_per_row: float
    samples: int

    def seconds_for(self, rows: int) -> float:
        """Estimated wall time for ``rows``."""
        return max(0.0, self.fixed_seconds + self.seconds_per_row * rows)


def fit_throughput(profiles: list[StageProfile]) -> ThroughputModel:
    """Least-squares line through (rows, seconds); with one distinct size, a rate through 0."""
    if not profiles:
        raise ValueError("cannot fit a throughput model without profiles")
    rows = np.array([p.rows for p in profiles], dtype=float)
    secs = np.array([p.seconds for p in profiles], dtype=float)
    first = profiles[0]
    if len(np.unique(rows)) >= 2:
        slope, intercept = np.polyfit(rows, secs, 1)
        if slope < 0 or intercept < 0:  # noisy fits: keep the model physical
            slope = max(float(slope), 0.0)
            intercept = max(float(np.mean(secs - slope * rows)), 0.0)
    else:
        slope = float(np.mean(secs) / max(rows[0], 1.0))
        intercept = 0.0
    return ThroughputModel(
        stage=first.stage,
        pool=first.pool,
        fixed_seconds=float(intercept),
        seconds_per_row=float(slope),
        samples=len(profiles),
    )


def record_profile(store: ObjectStore, profile: StageProfile) -> str:
    """Write one profile; returns its key."""
    key = profile_key(profile.stage, profile.pool, profile.recorded_at, secrets.token_hex(3))
    store.put_bytes(key, profile.model_dump_json().encode())
    return key


def read_profiles(store: ObjectStore, stage: str | None = None) -> list[StageProfile]:
    """All recorded profiles (of one stage), oldest first."""
    keys = [k for k in store.list(profiles_prefix(stage)) if k.endswith(".json")]
    return [StageProfile.model_validate_json(store.get_bytes(k)) for k in keys]


def throughput_models(
    profiles: list[StageProfile], last_n: int = 20
) -> dict[tuple[str, str], ThroughputModel]:
    """One model per (stage, pool), from the newest ``last_n`` profiles of each."""
    groups: dict[tuple[str, str], list[StageProfile]] = {}
    for p in sorted(profiles, key=lambda p: p.recorded_at):
        groups.setdefault((p.stage, p.pool), []).append(p)
    return {key: fit_throughput(group[-last_n:]) for key, group in groups.items()}
