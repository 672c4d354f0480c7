"""The workload router: for each stage, the pool that is cheapest while meeting its deadline.

"Profile first, then decide": with measured profiles of earlier runs on every candidate pool
the router fits a throughput model per (stage, pool) and picks the lowest estimated cost that
meets the deadline. Where a pool has no profile it falls back to the rules below — a table,
read top to bottom, first match wins. A pinned pool always wins.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, Field

from infra.routing.pools import PoolKind, PoolSpec
from infra.routing.profiles import ThroughputModel

LARGE_MODEL_PARAMS = 100_000_000
HUGE_MODEL_PARAMS = 10_000_000_000
LOW_LATENCY_MS = 50.0


class WorkloadKind(StrEnum):
    """What kind of work a stage is."""

    FEATURE_ENGINEERING = "feature_engineering"
    PREPROCESSING = "preprocessing"
    TRAINING = "training"
    BATCH_INFERENCE = "batch_inference"
    REALTIME_INFERENCE = "realtime_inference"


class StageWork(BaseModel):
    """What the router knows about a stage of the graph: its kind of work and whether its size
    grows with the input's events or with its customers."""

    stage: str
    kind: WorkloadKind
    scales_with: Literal["events", "customers"]


class Workload(BaseModel):
    """One stage's work as the router sees it."""

    stage: str
    kind: WorkloadKind
    rows: int = Field(ge=0)
    model_params: int = Field(default=0, ge=0)
    flops: float | None = Field(default=None, description="estimated FLOPs, when known")
    deadline_s: float | None = Field(default=None, gt=0)
    latency_target_ms: float | None = Field(default=None, gt=0)
    tight_budget: bool = False
    pinned_pool: str | None = None
    network: bool = Field(
        default=True, description="training: dense tensor work a GPU speeds up (a network)"
    )


@dataclass(frozen=True)
class Rule:
    """When ``applies``, prefer pools of these kinds in this order (only: no fallback kind)."""

    name: str
    applies: Callable[[Workload], bool]
    prefer: tuple[PoolKind, ...]
    reason: str


# The decision rules, as data. First match wins.
RULES: tuple[Rule, ...] = (
    Rule(
        "huge-model",
        lambda w: w.model_params > HUGE_MODEL_PARAMS,
        ("gpu",),
        "models over 10B parameters run on GPUs only",
    ),
    Rule(
        "low-latency-large-model",
        lambda w: (
            w.latency_target_ms is not None
            and w.latency_target_ms < LOW_LATENCY_MS
            and w.model_params >= LARGE_MODEL_PARAMS
        ),
        ("gpu", "cpu"),
        "latency target under 50 ms for a large model: GPU",
    ),
    Rule(
        "tight-budget",
        lambda w: w.tight_budget,
        ("cpu", "gpu"),
        "tight budget: CPU first",
    ),
    Rule(
        "tabular-training",
        lambda w: w.kind == WorkloadKind.TRAINING and not w.network,
        ("cpu", "gpu"),
        "a tabular fit (a linear model, trees) gains little from a GPU: CPU",
    ),
    Rule(
        "dense-training",
        lambda w: w.kind == WorkloadKind.TRAINING,
        ("gpu", "cpu"),
        "training is dense matrix work: GPU",
    ),
    Rule(
        "parallel-io-bound",
        lambda w: (
            w.kind
            in (
                WorkloadKind.FEATURE_ENGINEERING,
                WorkloadKind.PREPROCESSING,
                WorkloadKind.BATCH_INFERENCE,
                WorkloadKind.REALTIME_INFERENCE,
            )
        ),
        ("cpu", "gpu"),
        "embarrassingly parallel / I/O-bound work: CPU",
    ),
)


class PoolEstimate(BaseModel):
    """Estimated time and cost of a stage on one pool (None when nothing to estimate from)."""

    pool: str
    seconds: float | None
    cost_usd: float | None
    meets_deadline: bool | None
    from_profile: bool


class RoutingDecision(BaseModel):
    """Where a stage runs, the alternative, and why."""

    stage: str
    kind: WorkloadKind
    pool: str
    alternative: str | None
    reason: str
    basis: str = Field(description="pinned | profile | rule:<name>")
    estimates: list[PoolEstimate]
    profile_missing_on: list[str] = Field(default_factory=list)


def match_rule(workload: Workload) -> Rule:
    """The first rule that applies to ``workload``."""
    for rule in RULES:
        if rule.applies(workload):
            return rule
    raise ValueError(f"no routing rule covers workload kind {workload.kind}")


def estimate(workload: Workload, pool: PoolSpec, model: ThroughputModel | None) -> PoolEstimate:
    """Time and cost of ``workload`` on ``pool`` from its throughput model, if it has one."""
    if model is None:
        return PoolEstimate(
            pool=pool.name, seconds=None, cost_usd=None, meets_deadline=None, from_profile=False
        )
    seconds = model.seconds_for(workload.rows)
    meets = None if workload.deadline_s is None else seconds <= workload.deadline_s
    return PoolEstimate(
        pool=pool.name,
        seconds=seconds,
        cost_usd=seconds / 3600.0 * pool.price_per_hour,
        meets_deadline=meets,
        from_profile=True,
    )


def route(
    workload: Workload,
    pools: list[PoolSpec],
    models: dict[str, ThroughputModel],
) -> RoutingDecision:
    """Decide ``workload``'s pool. ``models`` maps pool name -> throughput model for this stage.

    A pin always wins; a rule that demands a GPU, or a pool without profiles, decides by rule;
    otherwise the cheapest measured pool that meets the deadline (else the fastest) wins."""
    candidates = [p for p in pools if p.available]
    if not candidates:
        raise ValueError("no work pool is available")
    estimates = [estimate(workload, p, models.get(p.name)) for p in candidates]
    missing = [e.pool for e in estimates if not e.from_profile]

    def decision(pool: str, alternative: str | None, reason: str, basis: str) -> RoutingDecision:
        return RoutingDecision(
            stage=workload.stage,
            kind=workload.kind,
            pool=pool,
            alternative=alternative,
            reason=reason,
            basis=basis,
            estimates=estimates,
            profile_missing_on=missing,
        )

    if workload.pinned_pool is not None:
        if workload.pinned_pool not in {p.name for p in candidates}:
            raise ValueError(
                f"pinned pool {workload.pinned_pool!r} is not an available pool "
                f"({', '.join(p.name for p in candidates)})"
            )
        alternative = _other(workload.pinned_pool, candidates)
        return decision(workload.pinned_pool, alternative, "pinned in the parameters", "pinned")

    rule = match_rule(workload)
    allowed = [p for p in candidates if p.kind in rule.prefer]
    if not allowed:
        raise ValueError(f"{workload.stage}: {rule.reason}, but no such pool is available")
    kinds = {p.name: p.kind for p in candidates}
    profiled = [e for e in estimates if e.from_profile and kinds[e.pool] in rule.prefer]
    if rule.prefer == ("gpu",) or missing or not profiled:
        chosen = _first_of_kinds(allowed, rule.prefer)
        why = rule.reason
        if missing and rule.prefer != ("gpu",):
            why += f" (no profile yet on {', '.join(missing)})"
        return decision(chosen.name, _other(chosen.name, allowed), why, f"rule:{rule.name}")
    best, alt, reason = _best_measured(profiled, workload.deadline_s)
    return decision(best.pool, alt.pool if alt else None, reason, "profile")


def _best_measured(
    profiled: list[PoolEstimate], deadline_s: float | None
) -> tuple[PoolEstimate, PoolEstimate | None, str]:
    """The cheapest measured pool that meets the deadline (else the fastest), the runner-up,
    and the reason in words."""
    meeting = [e for e in profiled if e.meets_deadline is not False]
    if not meeting:
        best = min(profiled, key=lambda e: e.seconds)
        alt = min(
            (e for e in profiled if e.pool != best.pool), key=lambda e: e.seconds, default=None
        )
        reason = (
            f"no pool meets the {_hms(deadline_s or 0)} deadline by measurement; "
            f"fastest is {_hms(best.seconds)}"
        )
        return best, alt, reason
    best = min(meeting, key=lambda e: (e.cost_usd, e.seconds))
    alt = min((e for e in profiled if e.pool != best.pool), key=lambda e: e.cost_usd, default=None)
    within = "" if deadline_s is None else f" within the {_hms(deadline_s)} deadline"
    reason = f"cheapest measured option{within}: ${best.cost_usd:.4f} in {_hms(best.seconds)}"
    if alt is not None:
        reason += f" vs ${alt.cost_usd:.4f} in {_hms(alt.seconds)} on {alt.pool}"
        if alt.meets_deadline is False:
            reason += " (misses the deadline)"
    return best, alt, reason


def _first_of_kinds(pools: list[PoolSpec], kinds: tuple[PoolKind, ...]) -> PoolSpec:
    for kind in kinds:
        for p in pools:
            if p.kind == kind:
                return p
    raise ValueError(f"no pool of kind {kinds}")


def _other(name: str, pools: list[PoolSpec]) -> str | None:
    return next((p.name for p in pools if p.name != name), None)


def _hms(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 90:
        return f"{seconds:.1f}s"
    if seconds < 5400:
        return f"{seconds / 60:.1f}min"
    return f"{seconds / 3600:.2f}h"


def parse_duration(text: str) -> float:
    """``90s``, ``15m``, ``2h``, ``1d`` or plain seconds -> seconds."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    t = text.strip().lower()
    try:
        if t and t[-1] in units:
            value = float(t[:-1]) * units[t[-1]]
        else:
            value = float(t)
    except ValueError:
        raise ValueError(f"not a duration (e.g. 90s, 15m, 2h): {text!r}") from None
    if value <= 0:
        raise ValueError(f"duration must be positive: {text!r}")
    return value
