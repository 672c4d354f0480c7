"""The endpoint's online features over a real folder store, without HTTP: a batch is appended to
the log and applied once however often it is sent; a refused batch changes nothing; replicas
writing the same log at once each apply every segment once and agree with the batch features
stage over the snapshot's events plus the log; a segment written by a process that died before
answering is applied once by the next; a new snapshot re-seeds."""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import json
import threading

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from infra.errors import HybridflowInputError
from infra.settings import IngestSettings
from infra.storage.events_log import SEGMENT_SCHEMA, EventsLog, export_into
from infra.storage.store import LocalFolderStore
from serving.metrics import ServingMetrics
from serving.online.features import fresh_features
from serving.online.ingest import IPC_MEDIA_TYPE, IngestError, check_contract, parse_events
from serving.online.service import OnlineFeatures
from serving.online.state import DAY_US, end_of_day_micros
from serving.snapshot import load_snapshot, newest_snapshot_manifest
from tasks.data.demo_events import DemoDataParams, generate_demo_events
from tasks.definitions.feature_specs import FEATURE_SPECS
from tasks.stages.validate import validate_stage
from tests.fixtures.online_events import BASE, BASE_DAY, events_table, random_stream
from tests.fixtures.online_store import online_sample_store, publish_run, scoring_table
from tests.unit.serving.test_ingest import ipc

NAMES = tuple(spec.name for spec in FEATURE_SPECS)
NOW = (BASE_DAY + 20.5) * 86_400  # the servers' clock: noon, 20 days after BASE


@pytest.fixture
def store(tmp_path):
    store = LocalFolderStore(tmp_path / "store")
    online_sample_store(store, events_table(random_stream(3, 30, 900, 500, False)), BASE)
    return store


def replica(store, metrics: ServingMetrics | None = None, **settings) -> OnlineFeatures:
    metrics = metrics or ServingMetrics()
    online = OnlineFeatures(store, IngestSettings(**settings), metrics, clock=lambda: NOW)
    follow(online, load_snapshot(store, newest_snapshot_manifest(store)))
    assert online.status == "on", online.status
    return online


def ingest(online: OnlineFeatures, body: bytes, content_type: str, key: str | None) -> dict:
    return asyncio.run(online.ingest(body, content_type, key))


def follow(online: OnlineFeatures, snapshot) -> None:
    asyncio.run(online.follow(snapshot))


def event(customer: str, day: int, hour: int, amount: float = 5.0, **more) -> dict:
    t = dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(days=BASE_DAY + day, hours=hour)
    return {"customer_id": customer, "event_time": t.isoformat(), "amount": amount, **more}


def body(*events: dict) -> bytes:
    return json.dumps(list(events)).encode()


def features(online: OnlineFeatures, ids: list[str]) -> np.ndarray:
    view = online.view(NAMES)
    rows = np.asarray([view.state.row_of[c] for c in ids])
    return fresh_features(view.state, rows, view.at_least_day, NAMES)[0]


def cutoff_day(online: OnlineFeatures) -> int:
    view = online.view(NAMES)
    return max(view.at_least_day, view.state.cutoff_day())


def batch_features(store, extra: list[pa.Table], day: int) -> dict[str, np.ndarray]:
    """The features stage's at the end of day ``day`` (days since the epoch) over the
    snapshot's events and ``extra``."""
    source = load_snapshot(store, newest_snapshot_manifest(store)).source
    events = pa.concat_tables(
        [pa.Table.from_batches(_events_of(store, source.events_data_prefix)), *extra]
    )
    table = scoring_table(events, dt.date(1970, 1, 1) + dt.timedelta(days=day))
    ids = table.column("customer_id").to_pylist()
    return {c: np.asarray([table.column(n)[i].as_py() for n in NAMES]) for i, c in enumerate(ids)}


def _events_of(store, data_prefix):
    keys = [k for k in store.list(data_prefix) if k.endswith(".parquet")]
    return [b for k in keys for b in pq.read_table(store.local_path(k)).to_batches()]


def test_a_batch_is_applied_once_however_often_it_is_sent(store):
    online = replica(store)
    batch = body(event("c1", 2, 9), event("newcomer", 3, 10, event_type="view", category="z"))
    first = ingest(online, batch, "application/json", None)
    again = ingest(online, batch, "application/json", None)
    assert (first["accepted"], first["duplicate"], first["segment"]) == (2, False, 1)
    assert (again["accepted"], again["duplicate"], again["segment"]) == (2, True, 1)
    assert online.follower.seq == 1 and EventsLog(store).head() == 1
    keyed = ingest(online, body(event("c2", 4, 1)), "application/json", "order-17")
    assert keyed["segment"] == 2 and keyed["segment_id"] == "order-17"
    with pytest.raises(IngestError) as caught:
        ingest(online, batch, "application/json", "order-17")
    assert caught.value.status == 409 and "used for a different batch (segment 2)" in str(
        caught.value
    )
    log_events = [EventsLog(store).read(s).events for s in (1, 2)]
    expected = batch_features(store, log_events, cutoff_day(online))
    ids = sorted(expected)
    assert "newcomer" in ids  # a customer seen only in the log is scored
    np.testing.assert_allclose(
        features(online, ids), [expected[c] for c in ids], rtol=1e-9, atol=1e-12
    )


def test_a_refused_batch_changes_nothing(store):
    online = replica(store)
    ingest(online, body(event("c1", 5, 12, event_type="purchase")), "application/json", None)
    before = features(online, ["c1", "c2"])
    cases = {
        "before_snapshot": event("c2", 0, 23),  # at or before the snapshot's cutoff (BASE's end)
        "in_the_future": event("c2", 21, 12),  # a day after the clock
        "purchase_out_of_order": event("c1", 4, 12),  # before c1's last purchase in the log
    }
    for reason, bad in cases.items():
        with pytest.raises(IngestError) as caught:
            ingest(online, body(event("fresh", 6, 1), bad), "application/json", None)
        assert caught.value.status == 422
        assert caught.value.extra["refused"] == {reason: 1}, reason
        assert f"[1].event_time: {reason}" in str(caught.value)
    assert online.follower.seq == 1 and EventsLog(store).head() == 1
    np.testing.assert_array_equal(features(online, ["c1", "c2"]), before)
    assert "fresh" not in online.follower.state.row_of
    view = ingest(online, body(event("c1", 5, 12, event_type="view")), "application/json", None)
    assert view["accepted"] == 1  # only purchases need their order


def test_replicas_writing_one_log_at_once_apply_every_segment_once_and_agree(store):
    a, b = replica(store), replica(store)
    rng = np.random.default_rng(0)
    sent: dict[str, list[int]] = {"a": [], "b": []}

    def send(online: OnlineFeatures, name: str, customers: list[str]) -> None:
        for i in range(12):
            rows = [
                event(customers[int(rng.integers(len(customers)))], 1 + i, h, float(h))
                for h in range(3)
            ]
            # views only: the purchase order is each customer's, and both replicas send
            answer = ingest(
                online,
                ipc(events_table([r | {"event_type": "view"} for r in _typed(rows)])),
                IPC_MEDIA_TYPE,
                None,
            )
            sent[name].append(answer["segment"])

    threads = [
        threading.Thread(target=send, args=(a, "a", ["c1", "c2", "x1"])),
        threading.Thread(target=send, args=(b, "b", ["c3", "c4", "x2"])),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(sent["a"] + sent["b"]) == list(range(1, 25))  # dense, none taken twice
    follow(a, load_snapshot(store, newest_snapshot_manifest(store)))
    follow(b, load_snapshot(store, newest_snapshot_manifest(store)))
    assert a.follower.seq == b.follower.seq == 24
    ids = sorted(a.follower.state.row_of)
    assert ids == sorted(b.follower.state.row_of)
    np.testing.assert_array_equal(features(a, ids), features(b, ids))
    log_events = [EventsLog(store).read(s).events for s in range(1, 25)]
    expected = batch_features(store, log_events, cutoff_day(a))
    np.testing.assert_allclose(features(a, ids), [expected[c] for c in ids], rtol=1e-9, atol=1e-12)


def _typed(rows: list[dict]) -> list[dict]:
    """JSON-style rows as the segments' typed rows."""
    out = []
    for r in rows:
        t = dt.datetime.fromisoformat(r["event_time"])
        out.append(
            {
                "customer_id": r["customer_id"],
                "event_time": t,
                "amount": r["amount"],
                "event_type": r.get("event_type", "purchase"),
                "quantity": 1,
                "category": r.get("category"),
                "channel": None,
            }
        )
    return out


def test_a_segment_written_before_a_crash_is_applied_once_and_its_resend_is_a_duplicate(store):
    batch = body(event("c1", 2, 9), event("c5", 2, 10))
    # what a process that died between writing the segment and answering left behind
    sha = hashlib.sha256(batch).hexdigest()
    table = check_contract(parse_events(batch, "application/json")).events
    EventsLog(store).append(1, table, f"sha256:{sha}", sha)
    restarted = replica(store)
    assert restarted.follower.seq == 1
    before = features(restarted, ["c1", "c5"])
    answer = ingest(restarted, batch, "application/json", None)
    assert answer["duplicate"] and answer["segment"] == 1
    np.testing.assert_array_equal(features(restarted, ["c1", "c5"]), before)


def test_a_new_snapshot_reseeds_and_keeps_the_log_after_its_cutoff(store):
    online = replica(store)
    ingest(online, body(event("c1", 2, 9), event("c2", 9, 9)), "application/json", None)
    segment = EventsLog(store).read(1).events
    source = load_snapshot(store, newest_snapshot_manifest(store)).source
    old = pa.Table.from_batches(_events_of(store, source.events_data_prefix))
    # the next batch run at BASE + 5 read the original events and the log
    publish_run(store, pa.concat_tables([old, segment]), BASE + dt.timedelta(days=5), "run-2")
    follow(online, load_snapshot(store, newest_snapshot_manifest(store)))
    assert online.follower.source.cutoff_micros == end_of_day_micros(BASE_DAY + 5)
    assert cutoff_day(online) == BASE_DAY + 9  # c2's event, after the new cutoff
    expected = batch_features(store, [], cutoff_day(online))  # run-2 has the log
    ids = sorted(expected)
    np.testing.assert_allclose(
        features(online, ids), [expected[c] for c in ids], rtol=1e-9, atol=1e-12
    )


def test_the_wall_clock_moves_the_features_day_on(store):
    log_clock, wall_clock = replica(store), replica(store, clock="wall")
    assert cutoff_day(log_clock) == BASE_DAY
    assert cutoff_day(wall_clock) == BASE_DAY + 20
    assert log_clock.view((*NAMES, "not_a_batch_feature")) is None  # the snapshot serves it


def test_without_events_behind_the_snapshot_there_is_no_online_state(tmp_path):
    from tests.fixtures.serving_sample import publish_sample_snapshot, sample_feature_table

    store = LocalFolderStore(tmp_path / "store")
    publish_sample_snapshot(store, sample_feature_table(10), BASE)
    online = OnlineFeatures(store, IngestSettings(), ServingMetrics(), clock=lambda: NOW)
    follow(online, load_snapshot(store, newest_snapshot_manifest(store)))
    assert online.follower is None and "names no events" in online.status
    with pytest.raises(IngestError) as caught:
        ingest(online, body(event("c1", 2, 9)), "application/json", None)
    assert caught.value.status == 503


def test_day_arithmetic():
    assert end_of_day_micros(BASE_DAY) + 1 == (BASE_DAY + 1) * DAY_US


def test_the_logs_segments_folder_is_a_batch_runs_events_input(store, tmp_path):
    online = replica(store)
    ingest(online, body(event("c1", 2, 9), event("n1", 3, 1, event_type="view")), "", None)
    ingest(online, body(event("c2", 4, 9, quantity=3, channel="web")), "", None)
    segments = store.local_path("events-log/segments")
    run_store = LocalFolderStore(tmp_path / "run-store")
    result = validate_stage(None, run_store, "run-on-the-log", str(segments), 0.0)
    assert (result.rows_read, result.rows_valid, result.rows_quarantined) == (3, 3, 0)
    assert set(result.available_columns) == set(SEGMENT_SCHEMA.names)


def test_a_segment_holds_its_batch_in_time_order(store):
    online = replica(store)
    ingest(online, body(event("c3", 9, 1), event("c4", 8, 1), event("c3", 8, 5)), "", None)
    times = EventsLog(store).read(1).events.column("event_time").to_pylist()
    assert times == sorted(times)
    expected = batch_features(store, [EventsLog(store).read(1).events], cutoff_day(online))
    ids = sorted(expected)
    np.testing.assert_allclose(
        features(online, ids), [expected[c] for c in ids], rtol=1e-9, atol=1e-12
    )


def test_a_snapshot_that_cannot_be_seeded_leaves_the_old_state_following_the_log(store):
    metrics = ServingMetrics()
    a, b = replica(store, metrics), replica(store)
    source = load_snapshot(store, newest_snapshot_manifest(store)).source
    old = pa.Table.from_batches(_events_of(store, source.events_data_prefix))
    newer = publish_run(store, old, BASE + dt.timedelta(days=1), "run-3")
    store.delete_prefix(newer.events_data_prefix)  # the new snapshot's events are gone
    snapshot = load_snapshot(store, newest_snapshot_manifest(store))
    follow(a, snapshot)
    assert a.status.startswith("stale: cannot seed from") and a.follower.source == source
    ingest(b, body(event("c1", 3, 9)), "", None)  # b has not seen the new snapshot yet
    follow(a, snapshot)  # refused again without a second try, but the log is followed
    assert a.follower.seq == 1
    failures = metrics.registry.get_sample_value(
        "hybridflow_serving_model_reload_failures_total", {"kind": "online", "reason": "seed_error"}
    )
    assert failures == 1


def test_exported_segments_join_the_original_events_in_one_run(store, tmp_path):
    original = tmp_path / "events"
    demo = generate_demo_events(DemoDataParams(customers=30, days=60, seed=2), original)
    online = replica(store)
    ingest(online, body(event("c1", 2, 9), event("n1", 3, 1, event_type="view")), "", None)
    ingest(online, body(event("c2", 4, 9, quantity=3, channel="web")), "", None)
    written = export_into(EventsLog(store), original)
    assert [p.name for p in written] == [
        "segment-000000000001.parquet",
        "segment-000000000002.parquet",
    ]
    demo_schema = pq.read_schema(next(original.glob("*.parquet"))).remove_metadata()
    assert all(pq.read_schema(p).remove_metadata() == demo_schema for p in written)
    assert export_into(EventsLog(store), original) == []  # nothing new
    result = validate_stage(None, LocalFolderStore(tmp_path / "run"), "run", str(original), 1.0)
    assert result.rows_read == demo.events + 3
    assert result.report.spark_jobs == 0  # one schema: validated in process

    (tmp_path / "csv").mkdir()
    (tmp_path / "csv" / "events.csv").write_text("customer_id,event_time,amount\n")
    with pytest.raises(HybridflowInputError, match="holds files other than Parquet"):
        export_into(EventsLog(store), tmp_path / "csv")
