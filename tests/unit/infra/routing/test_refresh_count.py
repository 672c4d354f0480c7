"""The refresh count of ``hybridflow cost``: refreshes run and skipped, and a fixed schedule's
GPU-hours over the same period at the measured cost of a refresh."""

from __future__ import annotations

import datetime as dt

from cli.commands.plan import format_costs, format_refreshes
from infra.routing.costs import CostReport, count_refreshes

START = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def _report(run_id: str, kind: str, refresh: str | None, gpu_hours: float, usd: float):
    return CostReport(
        run_id=run_id,
        created_at=START,
        stages=[],
        total_usd=usd,
        gpu_hours=gpu_hours,
        all_cpu_usd=0.0,
        all_gpu_usd=0.0,
        savings_vs_all_gpu_usd=0.0,
        basis="test",
        kind=kind,
        refresh=refresh,
    )


REPORTS = [
    _report("p1", "pipeline", "skipped", 0.0, 0.01),
    _report("p2", "pipeline", "drift", 0.0, 0.01),
    _report("r1", "refresh", "drift", 0.02, 0.10),
    _report("p3", "pipeline", "skipped", 0.0, 0.01),
    _report("r2", "refresh", "new-data", 0.04, 0.20),
]


def test_refreshes_are_counted_by_trigger_and_skips_by_pipeline_run():
    count = count_refreshes(REPORTS, 6.0, START, START + dt.timedelta(days=2))
    assert count.refreshes_run == 2 and count.refreshes_by_trigger == {"drift": 1, "new-data": 1}
    assert count.refreshes_skipped == 2
    assert count.gpu_hours == 0.06 and round(count.cost_usd, 6) == 0.30


def test_a_fixed_schedule_would_have_run_every_interval_at_the_mean_refresh_cost():
    count = count_refreshes(REPORTS, 6.0, START, START + dt.timedelta(days=2, hours=5))
    assert count.baseline_refreshes == 8  # 53 hours / 6
    assert round(count.baseline_gpu_hours, 6) == 8 * 0.03
    assert round(count.baseline_cost_usd, 6) == 8 * 0.15


def test_without_a_measured_refresh_the_baseline_gpu_hours_are_unknown():
    count = count_refreshes(REPORTS[:1], 6.0, START, START + dt.timedelta(hours=13))
    assert count.refreshes_run == 0 and count.baseline_refreshes == 2
    assert count.baseline_gpu_hours is None and count.baseline_cost_usd is None
    assert "GPU-hours not known until a refresh has run" in format_refreshes(count)


def test_the_cost_listing_says_what_each_run_did_about_a_refresh():
    text = format_costs(REPORTS)
    lines = {line.split()[0]: line for line in text.splitlines()[1:-1]}
    assert lines["p1"].endswith("skipped") and lines["p2"].endswith("asked (drift)")
    assert lines["r2"].endswith("ran (new-data)")
    summary = format_refreshes(count_refreshes(REPORTS, 6.0, START, START + dt.timedelta(days=1)))
    assert summary.startswith("refreshes run: 2 (1 drift, 1 new-data), 0.0600 GPU-h")
    assert "skipped: 2 " in summary and "a fixed 6h schedule over the same 1.0 days: 4" in summary


def test_a_refresh_is_priced_for_the_whole_time_it_held_its_pool(local_store):
    from infra.routing.accounting import account_refresh
    from infra.routing.costs import read_cost_reports
    from infra.routing.profiles import StageProfile, read_profiles
    from infra.settings import HybridflowSettings

    settings = HybridflowSettings(pool_price_overrides={"gpu-pool": 3.6})
    train = StageProfile(stage="train", pool="gpu-pool", device="cuda", rows=100, seconds=6.0)
    report = account_refresh(local_store, settings, "r-1", [train], "gpu-pool", 144.0, "drift")
    (cost,) = report.stages
    assert (cost.stage, cost.pool, cost.seconds) == ("model-refresh", "gpu-pool", 144.0)
    assert report.gpu_hours == 0.04 and round(report.total_usd, 6) == 0.144
    assert (report.kind, report.refresh) == ("refresh", "drift")
    assert [p.stage for p in read_profiles(local_store)] == ["train"]  # the router's data
    assert [r.run_id for r in read_cost_reports(local_store)] == ["r-1"]
