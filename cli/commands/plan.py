"""``hybridflow plan`` and ``hybridflow cost``: the routing plan before a run, costs after
(and the refreshes run and skipped against a fixed schedule)."""

from __future__ import annotations

import argparse

from cli.args import EXIT_OK, events_path, fraction, iso_date
from infra.errors import HybridflowInputError
from infra.prefect_runtime.api import prefect_api, start_temporary_api
from infra.routing.costs import CostReport, RefreshCount
from infra.routing.planner import RoutingPlan


def register(sub: argparse._SubParsersAction) -> None:
    """Add the subcommands."""
    plan = sub.add_parser("plan", help="print the routing plan for a run without running it")
    plan.add_argument("--events", required=True, help="Parquet/CSV file or folder of events")
    plan.add_argument("--as-of", type=iso_date, default=None)
    plan.add_argument("--deadline", default=None, help="pipeline deadline, e.g. 90m or 2h")
    plan.add_argument("--pin", action="append", default=[], metavar="STAGE=POOL")
    plan.add_argument("--tight-budget", action="store_true", help="CPU first where rules decide")
    plan.set_defaults(handler=run_plan)

    profile = sub.add_parser(
        "profile", help="measure the pipeline on a customer sample here, as a profile of this pool"
    )
    profile.add_argument("--events", required=True, help="Parquet/CSV file or folder of events")
    profile.add_argument("--sample-fraction", type=fraction, default=0.05)
    profile.add_argument("--as-of", type=iso_date, default=None)
    profile.set_defaults(handler=run_profile)

    cost = sub.add_parser(
        "cost", help="what runs cost, per run and in total; refreshes run and skipped"
    )
    cost.add_argument("--since", type=iso_date, default=None, help="first day to include")
    cost.set_defaults(handler=run_cost)


def parse_pins(pins: list[str]) -> dict[str, str]:
    """``["train=cpu-pool"]`` -> ``{"train": "cpu-pool"}``."""
    out = {}
    for pin in pins:
        stage, sep, pool = pin.partition("=")
        if not sep or not stage or not pool:
            raise HybridflowInputError(f"--pin wants STAGE=POOL, got {pin!r}")
        out[stage.strip()] = pool.strip()
    return out


def format_plan(plan: RoutingPlan) -> str:
    """The plan as a fixed-width table, like a cloud optimizer's."""
    header = (
        "stage",
        "pool",
        "est.time",
        "est.cost",
        "alternative",
        "alt.time",
        "alt.cost",
        "basis",
        "reason",
    )
    rows = []
    for d in plan.decisions:
        est = {e.pool: e for e in d.estimates}
        mine, alt = est.get(d.pool), est.get(d.alternative or "")
        rows.append(
            (
                d.stage,
                d.pool,
                _secs(mine.seconds if mine else None),
                _usd(mine.cost_usd if mine else None),
                d.alternative or "-",
                _secs(alt.seconds if alt else None),
                _usd(alt.cost_usd if alt else None),
                d.basis,
                d.reason,
            )
        )
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    if plan.estimated_seconds is not None:
        total = f"estimated total: {_secs(plan.estimated_seconds)}, {_usd(plan.estimated_cost_usd)}"
        if plan.deadline_s is not None:
            total += f" (deadline {_secs(plan.deadline_s)}: {'met' if plan.meets_deadline else 'MISSED'})"
        lines.append(total)
    lines += [f"note: {n}" for n in plan.notes]
    return "\n".join(lines)


def format_costs(reports: list[CostReport]) -> str:
    """One line per run and a total line."""
    if not reports:
        return "no cost reports yet: run the pipeline first"
    lines = [
        f"{'run':<38} {'date':<10} {'cost':>10} {'gpu-h':>8} {'all-cpu':>10} {'all-gpu':>10}"
        "  refresh"
    ]
    for r in reports:
        lines.append(
            f"{r.run_id:<38} {r.created_at:%Y-%m-%d} {_usd(r.total_usd):>10} {r.gpu_hours:8.4f} "
            f"{_usd(r.all_cpu_usd):>10} {_usd(r.all_gpu_usd):>10}  {_refresh_cell(r)}"
        )
    total = sum(r.total_usd for r in reports)
    lines.append(
        f"{'total (' + str(len(reports)) + ' runs)':<49} {_usd(total):>10} "
        f"{sum(r.gpu_hours for r in reports):8.4f} {_usd(sum(r.all_cpu_usd for r in reports)):>10} "
        f"{_usd(sum(r.all_gpu_usd for r in reports)):>10}"
    )
    return "\n".join(lines)


def _refresh_cell(report: CostReport) -> str:
    """``ran (drift)`` for a refresh run, what a pipeline run's data asked for otherwise."""
    if report.kind == "refresh":
        return f"ran ({report.refresh or 'manual'})"
    return {"skipped": "skipped", None: "-"}.get(report.refresh, f"asked ({report.refresh})")


def _secs(s: float | None) -> str:
    if s is None:
        return "-"
    return f"{s:.1f}s" if s < 90 else f"{s / 60:.1f}min" if s < 5400 else f"{s / 3600:.2f}h"


def _usd(v: float | None) -> str:
    return "-" if v is None else f"${v:.4f}"


def run_plan(args: argparse.Namespace) -> int:
    """Print the routing plan."""
    from flows.dag import ROUTED_STAGES
    from infra.settings import get_settings
    from infra.storage.store import open_store
    from tasks.policy.planning import plan_pipeline

    settings = get_settings()
    plan = plan_pipeline(
        args.events,
        settings,
        open_store(settings.store),
        deadline=args.deadline,
        pinned=parse_pins(args.pin),
        tight_budget=args.tight_budget,
        stages=ROUTED_STAGES,
    )
    print(format_plan(plan))
    return EXIT_OK


def format_refreshes(count: RefreshCount) -> str:
    """Refreshes run and skipped, and what a fixed schedule would have run over the period."""
    triggers = ", ".join(f"{n} {t}" for t, n in sorted(count.refreshes_by_trigger.items()))
    days = (count.period_end - count.period_start).total_seconds() / 86400
    baseline = (
        "GPU-hours not known until a refresh has run"
        if count.baseline_gpu_hours is None
        else f"{count.baseline_gpu_hours:.4f} GPU-h, {_usd(count.baseline_cost_usd)}"
    )
    return (
        f"refreshes run: {count.refreshes_run}{f' ({triggers})' if triggers else ''}, "
        f"{count.gpu_hours:.4f} GPU-h, {_usd(count.cost_usd)}; "
        f"skipped: {count.refreshes_skipped} (pipeline runs whose data asked for none)\n"
        f"a fixed {count.baseline_interval_hours:g}h schedule over the same {days:.1f} days: "
        f"{count.baseline_refreshes} refreshes, {baseline}"
    )


def run_cost(args: argparse.Namespace) -> int:
    """Print the cost reports since a date, and the refreshes run and skipped."""
    import datetime as dt

    from infra.routing.costs import count_refreshes, read_cost_reports
    from infra.settings import get_settings
    from infra.storage.store import open_store

    settings = get_settings()
    reports = read_cost_reports(open_store(settings.store), args.since)
    print(format_costs(reports))
    if reports:
        start = (
            dt.datetime.combine(args.since, dt.time(), dt.UTC)
            if args.since
            else reports[0].created_at
        )
        now = dt.datetime.now(dt.UTC)
        count = count_refreshes(reports, settings.refresh.baseline_interval_hours, start, now)
        print(format_refreshes(count))
    return EXIT_OK


def run_profile(args: argparse.Namespace) -> int:
    """Run a profiling run in this process (for the pool this machine belongs to)."""
    from infra.settings import get_settings

    start_temporary_api(get_settings())
    from flows.profiling import ProfileParams, profile_flow

    with prefect_api():
        result = profile_flow(
            ProfileParams(
                events=str(events_path(args)),
                sample_fraction=args.sample_fraction,
                as_of=args.as_of,
            )
        )
    print(
        f"recorded {result.profiles} stage profiles for {result.pool} "
        f"from {result.sample_rows:,} sampled events"
    )
    return EXIT_OK
