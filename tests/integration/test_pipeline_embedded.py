"""The whole DAG under Prefect's test harness with a real local Spark session."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from flows.pipeline import PipelineParams, pipeline_flow
from infra.storage.registry import ModelRegistry
from infra.storage.store import LocalFolderStore
from tasks.ml.metrics import log_loss

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def first_run(prefect_harness, spark, demo_events, tmp_path_factory):
    store_dir = tmp_path_factory.mktemp("pipeline-store")
    params = PipelineParams(events=str(demo_events), store=str(store_dir), device="cpu")
    return store_dir, params, pipeline_flow(params)


def test_predictions_follow_the_contract(first_run):
    _, _, summary = first_run
    preds = pd.read_parquet(summary.predictions_uri)
    assert list(preds.columns) == ["customer_id", "score", "model_version", "as_of"]
    assert preds.customer_id.dtype == object and preds.score.dtype == np.float64
    assert preds.score.between(0, 1).all()
    assert preds.customer_id.is_unique
    assert len(preds) == summary.rows_scored == 3000  # every customer seen <= T
    assert set(preds.model_version) == {summary.scored_with}
    assert set(pd.to_datetime(preds.as_of).dt.date) == {summary.as_of}


def test_model_beats_trivial_baselines_on_the_planted_signal(first_run):
    store_dir, _, summary = first_run
    m = summary.metrics
    assert m["n_test"] > 200
    assert 0.78 <= m["test_auc"] <= 0.97, m  # a constant or random score has AUC 0.5
    # the best constant prediction is the test positive rate; its log loss is the entropy
    rate = (
        ModelRegistry(LocalFolderStore(store_dir))
        .get(summary.model_version)
        .metrics["test_positive_rate"]
    )
    y = np.r_[np.ones(round(rate * 1000)), np.zeros(1000 - round(rate * 1000))]
    assert m["test_logloss"] < log_loss(y, np.full(len(y), rate)) - 0.05


def test_the_contenders_are_subflows_of_the_pipeline(first_run):
    """Fitted at the same time on threads (a small run on a multi-core box), each contender is
    still a flow run of its own under the pipeline's (Prefect's tree), none taken for another."""
    from uuid import UUID

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName

    _, _, summary = first_run
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(
            flow_filter=FlowFilter(name=FlowFilterName(any_=["contender"]))
        )
        mine = [
            r
            for r in runs
            if r.parent_task_run_id
            and client.read_task_run(r.parent_task_run_id).flow_run_id == UUID(summary.run_id)
        ]
    families = {row["family"] for row in summary.metrics["leaderboard"]}
    assert len(mine) == len(families) == len({r.parent_task_run_id for r in mine})
    assert all(r.state is not None and r.state.is_completed() for r in mine)


def test_registry_and_quarantine(first_run):
    store_dir, _, summary = first_run
    registry = ModelRegistry(LocalFolderStore(store_dir))
    assert summary.promoted and registry.alias().version == summary.model_version
    manifest = registry.get(summary.model_version)
    bundles = {"mlp": {"model.pt", "model.json"}, "gbm": {"model.txt", "model.json"}}
    assert set(manifest.files) == bundles.get(manifest.kind, {"model.json"})
    assert manifest.features and manifest.metrics["test_auc"] == pytest.approx(
        summary.metrics["test_auc"]
    )
    # demo data plants null ids, negative amounts and exact duplicates
    assert set(summary.quarantine_reasons) == {
        "missing_customer_id",
        "invalid_amount",
        "duplicate_event",
    }
    q = pd.read_parquet(summary.quarantine_uri)
    assert len(q) == summary.rows_quarantined and "reason" in q.columns
    assert summary.rows_read == summary.stages[0].rows_out + summary.rows_quarantined


def test_second_run_goes_through_the_gate(first_run):
    store_dir, params, first = first_run
    second = pipeline_flow(params)
    assert second.model_version != first.model_version
    registry = ModelRegistry(LocalFolderStore(store_dir))
    if second.metrics["family"] == first.metrics["family"]:  # the champion's family warm-starts
        assert registry.get(second.model_version).parent_version == first.model_version
    assert "production" in second.promotion_reason
    expected = second.model_version if second.promoted else first.model_version
    assert registry.alias().version == expected == second.scored_with


def test_run_is_planned_priced_and_profiled(first_run):
    from infra.routing.costs import read_cost_reports
    from infra.routing.profiles import read_profiles

    store_dir, _, summary = first_run
    store = LocalFolderStore(store_dir)
    # every stage planned ran, and each contender unit was routed on its own
    assert sorted(p["stage"] for p in summary.plan) == sorted(s.name for s in summary.stages)
    assert any(s.name.startswith("contender-") for s in summary.stages)
    assert dict((p["stage"], p["pool"]) for p in summary.plan)["train"] == "gpu-pool"
    cost = summary.cost
    assert cost["total_usd"] == pytest.approx(sum(s["cost_usd"] for s in cost["stages"]))
    assert {s["pool"] for s in cost["stages"]} == {"cpu-pool"}  # this box is a CPU node
    profiles = [p for p in read_profiles(store) if p.run_id == summary.run_id]
    assert sorted(p.stage for p in profiles) == sorted(s.name for s in summary.stages)
    assert all(p.seconds > 0 and p.peak_memory_mb and p.peak_memory_mb > 0 for p in profiles)
    assert summary.run_id in {r.run_id for r in read_cost_reports(store)}


def test_the_champion_is_recorded_in_the_summary_manifest_and_card(first_run):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    store_dir, _, summary = first_run
    board = summary.metrics["leaderboard"]
    assert sorted(r["family"] for r in board) == ["gbm", "logistic", "mlp", "rfm"]
    champion = board[0]
    assert champion["champion"] and champion["version"] == summary.model_version
    assert champion["family"] == summary.metrics["family"] and champion["basis"] == "backtest"
    assert [r["logloss"] for r in board] == sorted(r["logloss"] for r in board)
    assert all(r["size"] > 0 and r["train_seconds"] > 0 and r["pool"] for r in board)
    registry = ModelRegistry(LocalFolderStore(store_dir))
    manifest = registry.get(summary.model_version)
    assert manifest.kind == champion["family"]
    assert [r["version"] for r in manifest.leaderboard] == [r["version"] for r in board]
    for row in board[1:]:  # every contender is a version of its own, never promoted
        assert registry.get(row["version"]).kind == row["family"]
    with get_client(sync_client=True) as client:
        cards = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["model-card"]))
        )
    card = next(str(c.data) for c in cards if f"# Model {summary.model_version}" in str(c.data))
    assert "## Contenders" in card and f"| champion | {champion['family']} |" in card
    assert "![contenders (backtest)](data:image/svg+xml;base64," in card


def test_refresh_fine_tunes_the_champions_family_and_says_why_another_fits_fresh(first_run):
    from flows.refresh import RefreshParams, refresh_flow

    store_dir, params, _ = first_run
    registry = ModelRegistry(LocalFolderStore(store_dir))
    production = registry.get(registry.alias().version)
    refresh = RefreshParams(
        events=params.events, store=params.store, device="cpu", as_of=production.as_of
    )
    same = refresh_flow(refresh)
    assert same.family == production.kind
    # (an earlier run of the same fit from the same production is reused, and says so)
    assert same.warm_start
    assert same.start_reason.startswith(f"warm start from production {production.version}")
    assert registry.get(same.candidate_version).parent_version == production.version
    other = next(k for k in ("logistic", "gbm", "mlp") if k != production.kind)
    before = registry.alias().version
    fresh = refresh_flow(refresh.model_copy(update={"families": [other]}))
    assert fresh.family == other and not fresh.warm_start
    assert (
        f"production {before} is a " in fresh.start_reason
        and f"this fit is {other}" in fresh.start_reason
    )
