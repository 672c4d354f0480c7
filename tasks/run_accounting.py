"""Routing and accounting for a pipeline run: the plan before, profiles and costs after."""

from __future__ import annotations

import resource
from pathlib import Path

from infra.costs import CostReport, cost_report, save_cost_report
from infra.errors import HybridflowInputError
from infra.planning import (
    RoutingPlan,
    count_event_rows,
    mlp_parameters,
    pipeline_workloads,
    plan_run,
)
from infra.profiles import StageProfile, read_profiles, record_profile, throughput_models
from infra.routing import parse_duration
from infra.settings import HybridflowSettings
from infra.store import ObjectStore
from tasks.events_contract import OPTIONAL_DEFAULTS
from tasks.features import feature_names
from tasks.input_formats import list_event_files
from tasks.stage_records import StageReport


def plan_pipeline(
    events: str,
    settings: HybridflowSettings,
    store: ObjectStore,
    *,
    deadline: str | None = None,
    pinned: dict[str, str] | None = None,
    tight_budget: bool = False,
) -> RoutingPlan:
    """The routing plan for running the pipeline on ``events`` (nothing is run)."""
    files = list_event_files(Path(events).expanduser())
    try:
        n_features = len(feature_names(set(OPTIONAL_DEFAULTS)))
        workloads = pipeline_workloads(
            count_event_rows(files),
            mlp_parameters(n_features, settings.train.hidden_sizes),
            epochs=settings.train.max_epochs,
            pinned=pinned,
            tight_budget=tight_budget,
        )
        return plan_run(
            workloads,
            settings.priced_pools(),
            read_profiles(store),
            parse_duration(deadline) if deadline else None,
        )
    except ValueError as exc:
        raise HybridflowInputError(str(exc)) from None


def peak_memory_mb() -> float:
    """Peak resident memory of this process so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def embedded_pool(device: str) -> str:
    """The pool an in-process stage effectively ran on: this machine is a GPU or a CPU node."""
    return "gpu-pool" if device == "cuda" else "cpu-pool"


def account_run(
    store: ObjectStore,
    settings: HybridflowSettings,
    run_id: str,
    reports: list[StageReport],
    model_params: int = 0,
) -> CostReport:
    """Record a profile per stage, then price the run and its all-CPU/all-GPU alternatives."""
    for r in reports:
        record_profile(
            store,
            StageProfile(
                stage=r.name,
                pool=r.pool,
                device=r.device,
                rows=r.rows_in or 0,
                model_params=model_params if r.name in ("train", "batch_inference") else 0,
                seconds=r.seconds,
                peak_memory_mb=r.peak_memory_mb,
                run_id=run_id,
            ),
        )
    report = cost_report(
        run_id,
        [(r.name, r.pool, r.seconds, r.rows_in or 0) for r in reports],
        settings.priced_pools(),
        throughput_models(read_profiles(store)),
    )
    save_cost_report(store, report)
    return report
