"""After a run: record what each stage measured (the router learns from it) and price the run."""

from __future__ import annotations

import resource
from collections.abc import Mapping
from typing import Literal

from infra.routing.costs import CostReport, cost_report, save_cost_report
from infra.routing.pools import CPU_POOL, GPU_POOL
from infra.routing.profiles import StageProfile, read_profiles, record_profile, throughput_models
from infra.routing.router import WorkloadKind
from infra.settings import HybridflowSettings
from infra.storage.store import ObjectStore


def peak_memory_mb() -> float:
    """Peak resident memory of this process so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def embedded_pool(device: str) -> str:
    """The pool an in-process stage effectively ran on: this machine is a GPU or a CPU node."""
    return GPU_POOL if device == "cuda" else CPU_POOL


def record_stage_profiles(store: ObjectStore, profiles: list[StageProfile]) -> list[StageProfile]:
    """Record each stage run's measurements as a profile of the pool it ran on."""
    for profile in profiles:
        record_profile(store, profile)
    return profiles


def account_run(
    store: ObjectStore,
    settings: HybridflowSettings,
    run_id: str,
    profiles: list[StageProfile],
    kinds: Mapping[str, WorkloadKind],
    *,
    kind: Literal["pipeline", "refresh"] = "pipeline",
    refresh: str | None = None,
) -> CostReport:
    """Record the stages' profiles, then price the run and its all-CPU/all-GPU alternatives
    (``kind`` and ``refresh`` say what ran and why, for the refresh count of the cost report)."""
    record_stage_profiles(store, profiles)
    report = cost_report(
        run_id,
        [(p.stage, p.pool, p.seconds, p.rows) for p in profiles],
        settings.priced_pools(),
        throughput_models(read_profiles(store)),
        kinds,
    ).model_copy(update={"kind": kind, "refresh": refresh})
    save_cost_report(store, report)
    return report


REFRESH_ITEM = "model-refresh"


def account_refresh(
    store: ObjectStore,
    settings: HybridflowSettings,
    run_id: str,
    profiles: list[StageProfile],
    pool: str,
    seconds: float,
    trigger: str,
) -> CostReport:
    """A refresh holds its node for its whole run: record its stages' profiles (the router
    learns from them), then price the run's wall time on ``pool`` (its GPU-hours there)."""
    record_stage_profiles(store, profiles)
    report = cost_report(
        run_id,
        [(REFRESH_ITEM, pool, seconds, sum(p.rows for p in profiles))],
        settings.priced_pools(),
        kinds={REFRESH_ITEM: WorkloadKind.TRAINING},
    ).model_copy(update={"kind": "refresh", "refresh": trigger})
    save_cost_report(store, report)
    return report
