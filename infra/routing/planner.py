"""A routing plan for a whole pipeline run: one decision per stage, within a pipeline deadline.

Each stage is routed on its own (:func:`infra.routing.router.route`); then, if the measured estimates
add up to more than the deadline, the stage that buys the most seconds per extra dollar moves
to its faster pool, until the plan fits or nothing faster is left.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel, Field

from infra.routing.pools import PoolSpec
from infra.routing.profiles import StageProfile, ThroughputModel, throughput_models
from infra.routing.router import RoutingDecision, StageWork, Workload, WorkloadKind, route

DEFAULT_EVENTS_PER_CUSTOMER = 20.0


class RoutingPlan(BaseModel):
    """The decisions for every stage and the plan's estimated totals."""

    decisions: list[RoutingDecision]
    deadline_s: float | None = None
    estimated_seconds: float | None = None
    estimated_cost_usd: float | None = None
    meets_deadline: bool | None = None
    notes: list[str] = Field(default_factory=list)

    def pool_for(self, stage: str) -> str:
        """The pool chosen for ``stage``."""
        for d in self.decisions:
            if d.stage == stage:
                return d.pool
        raise KeyError(stage)


def count_event_rows(files: list[Path], csv_suffixes: tuple[str, ...]) -> int:
    """Rows in Parquet/CSV files, from Parquet footers or by counting the lines (minus header)
    of the files whose names end with one of ``csv_suffixes``."""
    import gzip

    import pyarrow.parquet as pq

    rows = 0
    for f in files:
        suffixes = [x.lower() for x in f.suffixes]
        if suffixes[-1:] in ([".parquet"], [".pq"]):
            rows += pq.ParquetFile(f).metadata.num_rows
        elif f.name.lower().endswith(csv_suffixes):
            opener = gzip.open if suffixes[-1] == ".gz" else open
            with opener(f, "rb") as fh:
                rows += max(sum(1 for _ in fh) - 1, 0)
    return rows


class ModelCost(BaseModel):
    """What the router knows about the model(s) a run trains and scores with, from the model
    families' cost hints (:meth:`tasks.ml.models.ModelFamily.cost_hints`)."""

    parameters: int = Field(ge=0, description="the largest contender's parameters")
    train_flops_per_row: float = Field(ge=0, description="all contenders' fits, per row")
    score_flops_per_row: float = Field(ge=0, description="scoring one row")


class ContenderCost(BaseModel):
    """One contender unit's fit as the router sees it: its stage (``contender-<family>``) and
    its family's cost hints."""

    stage: str
    parameters: int = Field(ge=0)
    train_flops_per_row: float = Field(ge=0, description="every training origin included")
    network: bool = Field(description="dense tensor work that a GPU speeds up")


def pipeline_workloads(
    event_rows: int,
    model: ModelCost,
    stages: Sequence[StageWork],
    *,
    customers: int | None = None,
    pinned: dict[str, str] | None = None,
    tight_budget: bool = False,
    contenders: Sequence[ContenderCost] = (),
) -> list[Workload]:
    """The stages, and each contender unit, as workloads sized from the input (customers
    estimated when unknown)."""
    pinned = pinned or {}
    unknown = set(pinned) - {s.stage for s in stages} - {c.stage for c in contenders}
    if unknown:
        raise ValueError(f"cannot pin unknown stage(s): {', '.join(sorted(unknown))}")
    customers = customers or max(1, int(event_rows / DEFAULT_EVENTS_PER_CUSTOMER))
    flops = {
        WorkloadKind.TRAINING: model.train_flops_per_row * customers,
        WorkloadKind.BATCH_INFERENCE: model.score_flops_per_row * customers,
    }
    per_family = [
        Workload(
            stage=c.stage,
            kind=WorkloadKind.TRAINING,
            rows=customers,
            model_params=c.parameters,
            flops=c.train_flops_per_row * customers,
            pinned_pool=pinned.get(c.stage),
            tight_budget=tight_budget,
            network=c.network,
        )
        for c in contenders
    ]
    staged = [
        Workload(
            stage=s.stage,
            kind=s.kind,
            rows=event_rows if s.scales_with == "events" else customers,
            model_params=model.parameters if s.kind in flops else 0,
            flops=flops.get(s.kind),
            pinned_pool=pinned.get(s.stage),
            tight_budget=tight_budget,
        )
        for s in stages
    ]
    # the contenders run before the training stage, which crowns them
    at = next((i for i, w in enumerate(staged) if w.kind == WorkloadKind.TRAINING), len(staged))
    return staged[:at] + per_family + staged[at:]


def plan_run(
    workloads: list[Workload],
    pools: list[PoolSpec],
    profiles: list[StageProfile],
    deadline_s: float | None = None,
) -> RoutingPlan:
    """Route every stage, then trade money for time until the plan meets ``deadline_s``."""
    models = throughput_models(profiles)
    decisions = [route(w, pools, _stage_models(models, w.stage)) for w in workloads]
    notes: list[str] = []
    if deadline_s is not None:
        decisions, notes = _fit_deadline(decisions, workloads, deadline_s)
    chosen = [_chosen_estimate(d) for d in decisions]
    known = [e for e in chosen if e is not None and e.seconds is not None]
    total_s = sum(e.seconds for e in known) if known else None
    total_usd = sum(e.cost_usd for e in known) if known else None
    if len(known) < len(decisions):
        notes.append("stages without profiles have no estimate (rules decided them)")
    return RoutingPlan(
        decisions=decisions,
        deadline_s=deadline_s,
        estimated_seconds=total_s,
        estimated_cost_usd=total_usd,
        meets_deadline=None if deadline_s is None or total_s is None else total_s <= deadline_s,
        notes=notes,
    )


def _stage_models(
    models: dict[tuple[str, str], ThroughputModel], stage: str
) -> dict[str, ThroughputModel]:
    return {pool: m for (s, pool), m in models.items() if s == stage}


def _chosen_estimate(d: RoutingDecision):
    return next((e for e in d.estimates if e.pool == d.pool), None)


def _fit_deadline(
    decisions: list[RoutingDecision], workloads: list[Workload], deadline_s: float
) -> tuple[list[RoutingDecision], list[str]]:
    decisions = list(decisions)
    notes: list[str] = []
    pinned = {w.stage for w in workloads if w.pinned_pool}
    while True:
        chosen = [_chosen_estimate(d) for d in decisions]
        total = sum(e.seconds for e in chosen if e is not None and e.seconds is not None)
        if total <= deadline_s:
            return decisions, notes
        best: tuple[float, int, str] | None = None
        for i, d in enumerate(decisions):
            cur = chosen[i]
            if d.stage in pinned or d.basis != "profile" or cur is None or cur.seconds is None:
                continue
            for e in d.estimates:
                if e.seconds is None or e.seconds >= cur.seconds:
                    continue
                per_second = (e.cost_usd - cur.cost_usd) / (cur.seconds - e.seconds)
                if best is None or per_second < best[0]:
                    best = (per_second, i, e.pool)
        if best is None:
            notes.append(
                f"no faster option left: the plan needs {total:.0f}s > deadline {deadline_s:.0f}s"
            )
            return decisions, notes
        _, i, pool = best
        old = decisions[i]
        decisions[i] = old.model_copy(
            update={
                "pool": pool,
                "alternative": old.pool,
                "reason": f"moved from {old.pool} to meet the pipeline deadline ({old.reason})",
            }
        )
        notes.append(f"{old.stage}: {old.pool} -> {pool} to meet the deadline")
