"""Drift on demo data with a planted shift (``demo-data --shift-after``): a pipeline run on
unshifted data flags nothing; the same customers after a shift in the purchase rate and the
channel mix flag exactly features the shift changes; the CLI exits 0 / 3 / 2 accordingly."""

from __future__ import annotations

import datetime as dt
import json

import httpx
import pytest

from cli.main import main
from flows.batch_inference import batch_inference_flow
from flows.drift import DriftParams, drift_flow
from flows.events import DRIFT_DETECTED, EVENTS_LANDED, REFRESH_LABEL
from flows.features import features_flow
from flows.params import StageParams
from flows.pipeline import PipelineParams, pipeline_flow
from flows.preprocess import preprocess_flow
from flows.validate import validate_flow
from infra.errors import StoreError
from infra.layout import drift_customers_prefix, drift_reference_key, stage_manifest_key
from infra.settings import get_settings
from infra.storage.registry import ModelRegistry
from infra.storage.store import LocalFolderStore
from tasks.data.demo_events import DemoDataParams, generate_demo_events
from tasks.reporting.records import PreprocessResult, read_stage_manifest
from tasks.stages.drift import build_reference, measure_drift
from tests.e2e.stack_driver import wait_for

pytestmark = pytest.mark.integration

T = dt.date(2025, 12, 31)
# the same 3,000 customers as the `demo_events` fixture, with a planted shift over the last 90
# days (the horizon): purchases and returns 3x as often, 80% of events moved to the app channel
SHIFT = {"shift_after": dt.date(2025, 10, 2), "shift_purchase_factor": 3.0, "shift_app_share": 0.8}
# what the shift cannot change: category mix and basket sizes (and tenure, ignored by default)
UNSHIFTED = {"n_categories", "top_category_share", "category_entropy", "basket_size_max"}
# what it must change clearly (PSI well above 0.1 on this data)
MUST_FLAG = {"purchases_90d", "trend_90d_vs_365d", "top_channel_share", "share_purchase"}
SHIFT_WORDS = ("purchase", "amount", "trend", "interpurchase", "share_", "channel", "recency")


def _changed_by_the_shift(feature: str) -> bool:
    """Features computed from purchase/return events or the channel column (the planted story),
    and the score, which reads them."""
    return feature == "score" or any(word in feature for word in SHIFT_WORDS)


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("drift-store")


@pytest.fixture(scope="module")
def production(prefect_harness, spark, demo_events, store_dir):
    """A pipeline run on unshifted data: production, its drift reference and its own check."""
    params = PipelineParams(events=str(demo_events), store=str(store_dir), device="cpu", as_of=T)
    return pipeline_flow(params)


@pytest.fixture(scope="module")
def shifted_events(tmp_path_factory):
    out = tmp_path_factory.mktemp("shifted") / "events"
    generate_demo_events(DemoDataParams(customers=3000, days=730, seed=11, **SHIFT), out)
    return out


@pytest.fixture
def cli_store(monkeypatch, store_dir):
    monkeypatch.setenv("HYBRIDFLOW_STORE", str(store_dir))
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


def _events(name: str, flow_run_id: str) -> list[dict]:
    """Events called ``name`` that flow run ``flow_run_id`` emitted."""
    from prefect.settings import PREFECT_API_URL

    body = {
        "filter": {
            "event": {"name": [name]},
            "related": {"id": [f"prefect.flow-run.{flow_run_id}"]},
        },
        "limit": 50,
    }
    response = httpx.post(f"{PREFECT_API_URL.value()}/events/filter", json=body, timeout=10)
    response.raise_for_status()
    return response.json()["events"]


@pytest.mark.slow(
    reason="the module's production: a pipeline run on the demo data (its fixtures), then drift"
)
def test_unshifted_data_flags_nothing_and_records_the_reference(production, store_dir):
    store = LocalFolderStore(store_dir)
    drift = production.drift
    assert production.promoted and drift["status"] == "stable", drift
    assert drift["drifted"] == {} and drift["model_version"] == production.model_version
    assert drift["refresh"]["reason"] == "skipped"  # no drift, production brand new
    report = json.loads(store.get_bytes(stage_manifest_key(production.run_id, "drift")))
    statuses = {r["feature"]: r["status"] for r in report["rows"]}
    assert statuses["tenure_days"] == "ignored"
    assert set(statuses.values()) <= {"ok", "ignored"}, statuses
    assert {"score", "unseen_customers", "purchases_90d"} <= set(statuses)
    assert store.exists(drift_reference_key(production.model_version))
    assert store.list(drift_customers_prefix(production.model_version))
    assert production.cost["refresh"] == "skipped"


def test_the_run_emits_landed_data_and_no_drift_event(production):
    run = production.flow_run_id
    (event,) = wait_for("the landed event", lambda: _events(EVENTS_LANDED, run), timeout=60)
    assert event["resource"][REFRESH_LABEL] == "none"
    assert event["payload"]["as_of"] == T.isoformat()
    assert event["payload"]["production_version"] == production.model_version
    assert event["id"] == production.drift["events"]["landed"]
    assert _events(DRIFT_DETECTED, run) == []  # sent before the landed event, had there been one


def test_cli_exits_0_within_thresholds(production, cli_store, capsys):
    # the features and predictions at T are still the unshifted run's
    assert main(["drift", "--as-of", T.isoformat()]) == 0
    out = capsys.readouterr().out
    assert "no drift at 2025-12-31 against " + production.model_version in out


@pytest.fixture(scope="module")
def shifted(production, shifted_events, store_dir):
    """The shifted events' features and predictions at T, and their drift report."""
    stage = StageParams(
        events=str(shifted_events), store=str(store_dir), run_id="shifted", device="cpu", as_of=T
    )
    validate_flow(stage)
    features_flow(stage)
    batch_inference_flow(stage)
    return drift_flow(DriftParams(as_of=T, store=str(store_dir), run_id="shifted"))


def test_shifted_data_flags_exactly_features_the_shift_changes(production, shifted):
    report = shifted
    flagged = {r.feature for r in report.drifted}
    assert report.status == "drifted" and report.model_version == production.model_version
    assert MUST_FLAG <= flagged, sorted(flagged)
    assert all(_changed_by_the_shift(f) for f in flagged), sorted(flagged)
    assert not flagged & UNSHIFTED
    rows = {r.feature: r for r in report.rows}
    assert rows["unseen_customers"].status == "ok"  # the same customers
    assert rows["score"].status != "n/a"  # production scored the shifted features


def test_cli_exits_3_on_drift_and_prints_the_table(shifted, cli_store, capsys):
    assert main(["drift", "--as-of", T.isoformat()]) == 3
    out = capsys.readouterr().out
    lines = out.strip().splitlines()
    assert lines[0].split() == ["feature", "measure", "value", "threshold", "status"]
    first = lines[1].split()
    assert first[-1] == "drift" and first[0] in MUST_FLAG | {"trend_amount_90d_vs_365d"}
    assert "drift at 2025-12-31 against" in lines[-1]


@pytest.mark.slow(
    reason="Spark's drift aggregates over the features of both demo data sets against numpy's"
)
def test_numpy_and_spark_aggregate_the_same_drift(production, shifted, store_dir, spark):
    """Datasets this small are binned in this process; Spark's jobs (``in_process_rows=0``)
    give the same reference (percentile_approx is exact at this size) and the same report."""
    store = LocalFolderStore(store_dir)
    in_process = get_settings().drift
    assert in_process.in_process_rows >= 3000
    in_spark = in_process.model_copy(update={"in_process_rows": 0})
    version = production.model_version
    sessions: list[object] = []

    def session():
        sessions.append(spark)
        return spark

    by_spark = build_reference(session, store, version, in_spark)
    assert sessions, "in_process_rows=0 must aggregate in Spark"
    by_numpy = build_reference(lambda: pytest.fail("needed Spark"), store, version, in_process)
    assert by_numpy.features == by_spark.features and by_numpy.score == by_spark.score
    reports = [
        measure_drift(provider, store, "parity", T, settings)
        for provider, settings in ((session, in_spark), (lambda: pytest.fail("Spark"), in_process))
    ]
    values = [{r.feature: r.value for r in report.rows} for report in reports]
    assert values[0].keys() == values[1].keys() and values[0] == pytest.approx(values[1])
    assert reports[0].rows_compared == reports[1].rows_compared == shifted.rows_compared
    assert {r.feature for r in reports[1].drifted} == {r.feature for r in shifted.drifted}


def test_cli_refuses_a_date_without_features(cli_store, capsys):
    assert main(["drift", "--as-of", "2020-01-01"]) == 2
    assert "no features published for as_of 2020-01-01" in capsys.readouterr().err


def test_a_reference_is_not_built_from_a_snapshot_replaced_since(
    production, shifted, shifted_events, demo_events, store_dir, spark
):
    store = LocalFolderStore(store_dir)
    recorded = ModelRegistry(store).get(production.model_version).snapshot
    stage = StageParams(events=str(shifted_events), store=str(store_dir), run_id="shifted", as_of=T)
    preprocess_flow(stage)  # another run's snapshot at the same as_of and horizon: its own key
    assert (
        recorded
        and recorded
        != read_stage_manifest(store, "shifted", "preprocess", PreprocessResult).snapshot_prefix
    )
    reference = build_reference(
        lambda: spark, store, production.model_version, get_settings().drift
    )
    assert reference.snapshot_prefix == recorded  # the model's own, untouched
    again = StageParams(
        events=str(demo_events),
        store=str(store_dir),
        run_id=production.run_id,
        as_of=T,
        use_cache=False,
    )
    preprocess_flow(again)  # the model's own run publishes its snapshot again
    with pytest.raises(StoreError, match="replaced after the model was trained"):
        build_reference(lambda: spark, store, production.model_version, get_settings().drift)
