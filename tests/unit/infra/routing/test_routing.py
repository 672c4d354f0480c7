"""The router's rules, its profile-based choice, deadlines, pins, and the cost report."""

from __future__ import annotations

import pytest

from cli.commands.plan import format_plan, parse_pins
from flows.dag import ROUTED_STAGES, STAGE_KINDS
from infra.errors import HybridflowInputError
from infra.routing.costs import cost_report
from infra.routing.planner import ModelCost, pipeline_workloads, plan_run
from infra.routing.pools import default_pools
from infra.routing.profiles import StageProfile, fit_throughput, throughput_models
from infra.routing.router import Workload, WorkloadKind, parse_duration, route

POOLS = default_pools()  # cpu-pool $1.75/h (64 vCPU), gpu-pool $4.25/h (1 GPU)


def _w(kind: WorkloadKind, **kw) -> Workload:
    return Workload(
        stage=kw.pop("stage", kind.value), kind=kind, rows=kw.pop("rows", 1_000_000), **kw
    )


@pytest.mark.parametrize(
    ("workload", "pool", "basis"),
    [
        (_w(WorkloadKind.FEATURE_ENGINEERING), "cpu-pool", "rule:parallel-io-bound"),
        (_w(WorkloadKind.PREPROCESSING), "cpu-pool", "rule:parallel-io-bound"),
        (
            _w(WorkloadKind.BATCH_INFERENCE, model_params=10_000),
            "cpu-pool",
            "rule:parallel-io-bound",
        ),
        (_w(WorkloadKind.TRAINING, model_params=10_000), "gpu-pool", "rule:dense-training"),
        (
            _w(WorkloadKind.REALTIME_INFERENCE, model_params=500_000_000, latency_target_ms=20),
            "gpu-pool",
            "rule:low-latency-large-model",
        ),
        (
            _w(WorkloadKind.REALTIME_INFERENCE, model_params=5_000, latency_target_ms=20),
            "cpu-pool",
            "rule:parallel-io-bound",
        ),
        (
            _w(WorkloadKind.BATCH_INFERENCE, model_params=20_000_000_000),
            "gpu-pool",
            "rule:huge-model",
        ),
        (_w(WorkloadKind.TRAINING, tight_budget=True), "cpu-pool", "rule:tight-budget"),
    ],
)
def test_rules_without_profiles(workload, pool, basis):
    decision = route(workload, POOLS, {})
    assert (decision.pool, decision.basis) == (pool, basis)
    assert decision.reason and decision.profile_missing_on == ["cpu-pool", "gpu-pool"]


def _profiles(stage: str, cpu_rows_per_s: float, gpu_rows_per_s: float) -> list[StageProfile]:
    out = []
    for rows in (10_000, 100_000):
        out.append(
            StageProfile(
                stage=stage, pool="cpu-pool", device="cpu", rows=rows, seconds=rows / cpu_rows_per_s
            )
        )
        out.append(
            StageProfile(
                stage=stage,
                pool="gpu-pool",
                device="cuda",
                rows=rows,
                seconds=rows / gpu_rows_per_s,
            )
        )
    return out


def _models(profiles, stage):
    return {pool: m for (s, pool), m in throughput_models(profiles).items() if s == stage}


def test_small_model_trains_on_cpu_when_cheaper_and_on_time():
    # GPU is 2x faster but 2.4x the price: CPU is cheaper, and 1M rows take 100 s there.
    models = _models(_profiles("train", 10_000, 20_000), "train")
    d = route(_w(WorkloadKind.TRAINING, stage="train", deadline_s=3600), POOLS, models)
    assert d.pool == "cpu-pool" and d.basis == "profile" and d.alternative == "gpu-pool"
    cpu = next(e for e in d.estimates if e.pool == "cpu-pool")
    assert cpu.seconds == pytest.approx(100.0) and cpu.cost_usd == pytest.approx(100 / 3600 * 1.75)


def test_gpu_when_cpu_would_miss_the_deadline():
    models = _models(_profiles("train", 10_000, 20_000), "train")
    d = route(_w(WorkloadKind.TRAINING, stage="train", deadline_s=60), POOLS, models)
    assert d.pool == "gpu-pool" and "misses the deadline" in d.reason


def test_fastest_pool_when_nothing_meets_the_deadline():
    models = _models(_profiles("train", 10_000, 20_000), "train")
    d = route(_w(WorkloadKind.TRAINING, stage="train", deadline_s=1), POOLS, models)
    assert d.pool == "gpu-pool" and "no pool meets" in d.reason


def test_missing_profile_on_one_pool_falls_back_to_rules():
    only_cpu = [p for p in _profiles("train", 10_000, 20_000) if p.pool == "cpu-pool"]
    d = route(_w(WorkloadKind.TRAINING, stage="train"), POOLS, _models(only_cpu, "train"))
    assert d.basis == "rule:dense-training" and d.profile_missing_on == ["gpu-pool"]


def test_pinned_pool_always_wins():
    models = _models(_profiles("train", 10_000, 20_000), "train")
    d = route(
        _w(WorkloadKind.TRAINING, stage="train", deadline_s=1, pinned_pool="cpu-pool"),
        POOLS,
        models,
    )
    assert (d.pool, d.basis, d.reason) == ("cpu-pool", "pinned", "pinned in the parameters")
    with pytest.raises(ValueError, match="not an available pool"):
        route(_w(WorkloadKind.TRAINING, pinned_pool="tpu-pool"), POOLS, {})


def test_throughput_fit_recovers_fixed_and_per_row_cost():
    profiles = [
        StageProfile(stage="s", pool="p", device="cpu", rows=r, seconds=5 + r * 1e-4)
        for r in (1000, 10_000, 50_000)
    ]
    m = fit_throughput(profiles)
    assert m.fixed_seconds == pytest.approx(5.0) and m.seconds_per_row == pytest.approx(1e-4)
    assert m.seconds_for(100_000) == pytest.approx(15.0)


def _cost(params: int) -> ModelCost:
    return ModelCost(
        parameters=params, train_flops_per_row=60.0 * params, score_flops_per_row=2.0 * params
    )


def test_plan_moves_the_best_value_stage_to_meet_a_pipeline_deadline():
    # train: CPU 10 s for $0.0049 vs GPU 5 s for $0.0059; features: CPU 40 s, GPU 50 s
    profiles = _profiles("train", 10_000, 20_000) + _profiles("features", 50_000, 40_000)
    params = 30 * 64 + 64 + 64 * 32 + 32 + 32 + 1  # the default MLP on 30 features
    cost = ModelCost(
        parameters=params, train_flops_per_row=60 * params, score_flops_per_row=2 * params
    )
    workloads = pipeline_workloads(2_000_000, cost, ROUTED_STAGES, customers=100_000)
    relaxed = plan_run(workloads, POOLS, profiles)
    assert relaxed.pool_for("train") == "cpu-pool"  # cheaper without a deadline
    tight = plan_run(workloads, POOLS, profiles, deadline_s=47)
    assert tight.pool_for("train") == "gpu-pool" and tight.pool_for("features") == "cpu-pool"
    assert any("to meet the deadline" in n for n in tight.notes)
    assert tight.meets_deadline is True


def test_cost_report_adds_up():
    report = cost_report(
        "run-1",
        [("features", "cpu-pool", 3600.0, 1000), ("train", "gpu-pool", 1800.0, 100)],
        POOLS,
        kinds=STAGE_KINDS,
    )
    assert report.total_usd == pytest.approx(1.75 + 4.25 / 2)
    assert report.total_usd == pytest.approx(sum(s.cost_usd for s in report.stages))
    assert report.gpu_hours == pytest.approx(0.5)
    # alternatives by the documented relative speeds: features 0.5x on GPU, training 10x
    assert report.all_gpu_usd == pytest.approx(2 * 4.25 + 0.5 * 4.25)
    assert report.all_cpu_usd == pytest.approx(1.75 + 5 * 1.75)
    assert report.savings_vs_all_gpu_usd == pytest.approx(report.all_gpu_usd - report.total_usd)


def test_plan_output_is_stable_and_readable():
    workloads = pipeline_workloads(
        1_000_000, _cost(5000), ROUTED_STAGES, pinned={"train": "cpu-pool"}
    )
    text = format_plan(plan_run(workloads, POOLS, []))
    lines = text.splitlines()
    assert lines[0].split() == [
        "stage",
        "pool",
        "est.time",
        "est.cost",
        "alternative",
        "alt.time",
        "alt.cost",
        "basis",
        "reason",
    ]
    assert [line.split()[0] for line in lines[1:6]] == [
        "validate",
        "features",
        "preprocess",
        "train",
        "batch_inference",
    ]
    assert "pinned in the parameters" in lines[4]
    assert text == format_plan(plan_run(workloads, POOLS, []))


def test_parsing_helpers():
    assert (
        parse_duration("2h") == 7200 and parse_duration("90") == 90 and parse_duration("15m") == 900
    )
    with pytest.raises(ValueError):
        parse_duration("soon")
    assert parse_pins(["train=cpu-pool"]) == {"train": "cpu-pool"}
    with pytest.raises(HybridflowInputError):
        parse_pins(["train"])
    with pytest.raises(ValueError, match="unknown stage"):
        pipeline_workloads(10, _cost(10), ROUTED_STAGES, pinned={"nope": "cpu-pool"})


def test_each_contender_is_routed_on_its_own_family_cost_and_profiles():
    from infra.routing.planner import ContenderCost

    contenders = [
        ContenderCost(
            stage="contender-logistic", parameters=30, train_flops_per_row=1e3, network=False
        ),
        ContenderCost(
            stage="contender-gbm", parameters=9000, train_flops_per_row=1e5, network=False
        ),
        ContenderCost(
            stage="contender-mlp", parameters=5000, train_flops_per_row=1e6, network=True
        ),
    ]
    workloads = pipeline_workloads(
        1_000_000, _cost(5000), ROUTED_STAGES, customers=50_000, contenders=contenders
    )
    plan = plan_run(workloads, default_pools(), [])
    assert plan.pool_for("contender-logistic") == "cpu-pool"
    assert plan.pool_for("contender-gbm") == "cpu-pool"
    assert plan.pool_for("contender-mlp") == "gpu-pool"
    logistic = next(d for d in plan.decisions if d.stage == "contender-logistic")
    assert logistic.basis == "rule:tabular-training" and "CPU" in logistic.reason
    mlp = next(w for w in workloads if w.stage == "contender-mlp")
    assert mlp.flops == 1e6 * 50_000 and mlp.model_params == 5000

    # measured profiles of one family move that family only
    profiles = [
        StageProfile(
            stage="contender-mlp", pool=pool, device="cpu", rows=rows, seconds=s, run_id=f"r{i}"
        )
        for i, (pool, rows, s) in enumerate(
            [
                ("cpu-pool", 10_000, 2.0),
                ("cpu-pool", 50_000, 8.0),
                ("gpu-pool", 10_000, 9.0),
                ("gpu-pool", 50_000, 30.0),
            ]
        )
    ]
    measured = plan_run(workloads, default_pools(), profiles)
    assert measured.pool_for("contender-mlp") == "cpu-pool"
    assert next(d for d in measured.decisions if d.stage == "contender-mlp").basis == "profile"
    assert measured.pool_for("contender-gbm") == "cpu-pool"

    pinned = pipeline_workloads(
        10, _cost(10), ROUTED_STAGES, contenders=contenders, pinned={"contender-gbm": "gpu-pool"}
    )
    assert plan_run(pinned, default_pools(), []).pool_for("contender-gbm") == "gpu-pool"
