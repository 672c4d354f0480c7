"""``hybridflow serve`` with online features, as real processes over a moto S3 store on loopback:
events ingested while a new model is hot-reloaded and a second replica tails the same log (no
request fails, both replicas end with the same scores, which are batch inference's on the batch
features over the snapshot's events plus the log); an endpoint killed with SIGKILL mid-ingest and
restarted (every acknowledged batch applied once, no refused one); bad input over HTTP (a clear
4xx naming the problem, nothing applied)."""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import threading

import httpx
import numpy as np
import pyarrow as pa
import pytest
from serving_process import metric_value, running_server, wait_for

from infra.storage.events_log import EventsLog
from infra.storage.store import S3Store
from serving.online.state import DAY_US
from tasks.engines.scorer import scores_of_table
from tasks.stages.batch_inference import load_scoring_model
from tests.fixtures.moto_s3 import BUCKET
from tests.fixtures.online_events import BASE, BASE_DAY, events_table, random_stream
from tests.fixtures.online_store import online_sample_store, scoring_table
from tests.fixtures.serving_sample import register_sample_model

pytestmark = pytest.mark.e2e

TOKEN = "ingest-token-5d1c"
ENV = {
    "HYBRIDFLOW_SERVE__INGEST__TOKEN": TOKEN,
    "HYBRIDFLOW_SERVE__INGEST__TAIL_INTERVAL_S": "0.2",
    "HYBRIDFLOW_SERVE__POLL_INTERVAL_S": "0.2",
}
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def online_store(prefix: str, seed: int) -> tuple[S3Store, pa.Table, str]:
    store = S3Store(f"s3://{BUCKET}/{prefix}", retries=3, backoff_s=0.05)
    events = events_table(random_stream(seed, 120, 2500, 500, False))
    _, version = online_sample_store(store, events, BASE)
    return store, events, version


def stream_batches(
    customers: list[str], batches: int, per_batch: int, seed: int
) -> list[list[dict]]:
    """JSON events after the snapshot, in time order (so each customer's purchases stay in
    order across batches sent one after another)."""
    rng = np.random.default_rng(seed)
    start = (BASE_DAY + 1) * DAY_US
    times = np.sort(start + rng.integers(0, 30 * DAY_US, size=batches * per_batch))
    types = ["purchase", "view", "add_to_cart"]
    rows = [
        {
            "customer_id": customers[int(rng.integers(len(customers)))],
            "event_time": (
                dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(microseconds=int(t))
            ).isoformat(),
            "amount": round(float(rng.exponential(30.0)), 2),
            "event_type": types[int(rng.integers(3))],
            "category": ["a", "b", "z"][int(rng.integers(3))],
        }
        for t in times
    ]
    return [rows[i * per_batch : (i + 1) * per_batch] for i in range(batches)]


def online_report(client: httpx.Client | str) -> dict:
    """The online part of ``/ready`` (of a client, or of a server's URL)."""
    ready = (
        client.get("/ready") if isinstance(client, httpx.Client) else httpx.get(f"{client}/ready")
    )
    return ready.json().get("online", {})


def scores(client: httpx.Client, customers: list[str]) -> tuple[dict[str, float], set[str]]:
    """Every customer's score (and the features_as_of answers) in batches of 200."""
    out: dict[str, float] = {}
    as_of: set[str] = set()
    for i in range(0, len(customers), 200):
        items = [{"customer_id": c} for c in customers[i : i + 200]]
        r = client.post("/predict", json={"items": items})
        assert r.status_code == 200, r.text
        as_of.add(r.json()["features_as_of"])
        out.update({it["customer_id"]: it["score"] for it in r.json()["items"]})
    return out, as_of


def batch_scores(store: S3Store, events: pa.Table, version: str, day: int) -> dict[str, float]:
    """Batch inference's scores on the features stage's features at the end of ``day`` over
    the snapshot's events plus every segment of the log."""
    log = EventsLog(store)
    segments = [log.read(s).events for s in range(1, log.head() + 1)]
    table = scoring_table(
        pa.concat_tables([events, *segments]), dt.date(1970, 1, 1) + dt.timedelta(days=day)
    )
    values = scores_of_table(table, load_scoring_model(store, version))
    return dict(zip(table.column("customer_id").to_pylist(), values.tolist(), strict=True))


def test_ingest_while_a_model_reloads_and_a_second_replica_tails_the_log(s3_endpoint, tmp_path):
    store, events, v1 = online_store("online-replicas", 21)
    seeded = sorted(set(events.column("customer_id").to_pylist()))
    to_a = stream_batches(seeded[:60] + [f"new-a{i}" for i in range(10)], 12, 40, 1)
    to_b = stream_batches(seeded[60:] + [f"new-b{i}" for i in range(10)], 12, 40, 2)
    with (
        running_server(store.uri, tmp_path / "a", ENV) as a,
        running_server(store.uri, tmp_path / "b", ENV) as b,
        httpx.Client(base_url=a.url, timeout=30) as ca,
        httpx.Client(base_url=b.url, timeout=30) as cb,
    ):
        for c in (ca, cb):
            wait_for(lambda c=c: online_report(c).get("status") == "on", 60, "online state")
        failures: list[str] = []
        stop = threading.Event()

        def predicting(client: httpx.Client) -> None:
            rng = np.random.default_rng(3)
            while not stop.is_set():
                customer = seeded[int(rng.integers(len(seeded)))]
                r = client.post("/predict", json={"customer_id": customer})
                if r.status_code != 200:
                    failures.append(f"predict {r.status_code} {r.text}")

        def ingesting(client: httpx.Client, batches: list[list[dict]]) -> None:
            for batch in batches:
                r = client.post("/events", json=batch, headers=AUTH)
                if r.status_code != 200:
                    failures.append(f"events {r.status_code} {r.text}")

        workers = [
            threading.Thread(target=predicting, args=(ca,)),
            threading.Thread(target=predicting, args=(cb,)),
            threading.Thread(target=ingesting, args=(ca, to_a)),
            threading.Thread(target=ingesting, args=(cb, to_b)),
        ]
        for w in workers:
            w.start()
        v2 = register_sample_model(store, scoring_table(events, BASE), seed=2)  # hot reload
        for c in (ca, cb):
            wait_for(lambda c=c: c.get("/ready").json()["model_version"] == v2, 60, "v2")
        for w in workers[2:]:
            w.join()
        for c in (ca, cb):
            wait_for(lambda c=c: online_report(c).get("log_position") == 24, 60, "the log's end")
        stop.set()
        for w in workers[:2]:
            w.join()
        assert failures == []
        customers = seeded + [f"new-{r}{i}" for r in "ab" for i in range(10)]
        got_a, as_of_a = scores(ca, customers)
        got_b, as_of_b = scores(cb, customers)
        assert got_a == got_b and as_of_a == as_of_b and len(as_of_a) == 1
        day = online_report(ca)["features_as_of"][:10]
        cutoff_day = (dt.date.fromisoformat(day) - dt.date(1970, 1, 1)).days
        expected = batch_scores(store, events, v2, cutoff_day)
        assert set(expected) == set(customers)
        np.testing.assert_allclose(
            [got_a[c] for c in customers], [expected[c] for c in customers], rtol=0, atol=1e-6
        )
        metrics = ca.get("/metrics").text
        assert metric_value(metrics, "hybridflow_serving_events_log_position") == 24
        assert metric_value(
            metrics, "hybridflow_serving_events_ingested_total", result="accepted"
        ) == sum(len(batch) for batch in to_a)


def test_a_killed_endpoint_applies_every_acknowledged_batch_once(s3_endpoint, tmp_path):
    store, events, version = online_store("online-kill", 22)
    seeded = sorted(set(events.column("customer_id").to_pylist()))
    batches = stream_batches(seeded + ["new-k"], 60, 50, 3)
    bad = {7, 19, 33}  # refused: a negative amount
    for i in bad:
        batches[i] = [*batches[i][:-1], {**batches[i][-1], "amount": -1.0}]
    acked: list[int] = []
    refused: list[int] = []
    unanswered: list[int] = []

    def sending(url: str, start: int) -> None:
        with httpx.Client(base_url=url, timeout=30) as client:
            for i in range(start, len(batches)):
                headers = AUTH | {"Idempotency-Key": f"batch-{i}"}
                try:
                    r = client.post("/events", json=batches[i], headers=headers)
                except httpx.TransportError:
                    unanswered.append(i)
                    return
                (acked if r.status_code == 200 else refused).append(i)
                if r.status_code not in (200, 422):
                    raise AssertionError(r.text)

    with running_server(store.uri, tmp_path / "first", ENV) as first:
        wait_for(lambda: online_report(first.url).get("status") == "on", 60, "on")
        sender = threading.Thread(target=sending, args=(first.url, 0))
        sender.start()
        wait_for(lambda: len(acked) >= 15, 60, "15 acknowledged batches")
        os.kill(first.process.pid, signal.SIGKILL)
        sender.join()
        first.process.wait(timeout=10)
    assert unanswered, "every batch was answered before the kill"
    with (
        running_server(store.uri, tmp_path / "second", ENV) as second,
        httpx.Client(base_url=second.url, timeout=30) as client,
    ):
        wait_for(lambda: online_report(client).get("status") == "on", 60, "on again")
        sending(second.url, unanswered[0])  # the unanswered batch again, then the rest
        segments = [EventsLog(store).read(s) for s in range(1, EventsLog(store).head() + 1)]
        ids = [s.info.segment_id for s in segments]
        assert len(ids) == len(set(ids))  # no batch twice
        assert set(ids) == {f"batch-{i}" for i in acked}
        assert set(acked) | set(refused) == set(range(len(batches))) and set(refused) == bad
        wait_for(
            lambda: online_report(client).get("log_position") == len(segments), 30, "caught up"
        )
        applied = metric_value(
            client.get("/metrics").text, "hybridflow_serving_events_applied_total"
        )
        assert applied == sum(s.info.rows for s in segments)  # each once, by the restarted process
        day = online_report(client)["features_as_of"][:10]
        cutoff_day = (dt.date.fromisoformat(day) - dt.date(1970, 1, 1)).days
        expected = batch_scores(store, events, version, cutoff_day)
        got, _ = scores(client, sorted(expected))
        np.testing.assert_allclose(
            [got[c] for c in sorted(expected)], [expected[c] for c in sorted(expected)], atol=1e-6
        )


def test_bad_input_gets_a_clear_4xx_and_nothing_is_applied(s3_endpoint, tmp_path):
    store, events, _ = online_store("online-bad", 23)
    good = stream_batches(["c1"], 1, 2, 4)[0]
    event = good[0]
    future = {**event, "event_time": "2099-01-01T00:00:00Z"}
    before = {**event, "event_time": "2025-06-30T12:00:00Z"}
    json_type = {"content-type": "application/json"}
    cases = [
        (b"[{not json", json_type, 422, "body: body is not valid JSON"),
        (
            b"\x00garbage",
            {"content-type": "application/vnd.apache.arrow.stream"},
            422,
            "not an Arrow IPC stream",
        ),
        (
            json.dumps([{**event, "amount": "12"}]).encode(),
            json_type,
            422,
            "[0].amount: must be a number",
        ),
        (
            json.dumps([{**event, "colour": "red"}]).encode(),
            json_type,
            422,
            "[0].colour: unknown column",
        ),
        (json.dumps([event, future]).encode(), json_type, 422, "[1].event_time: in_the_future"),
        (json.dumps([before, event]).encode(), json_type, 422, "[0].event_time: before_snapshot"),
        (json.dumps([event, event]).encode(), json_type, 422, "1 duplicate_event"),
        (
            b"[" + b" " * (50 * 1024 * 1024) + b"]",
            json_type,
            413,
            "body: larger than 33554432 bytes",
        ),
    ]
    with (
        running_server(store.uri, tmp_path / "bad", ENV) as server,
        httpx.Client(base_url=server.url, timeout=60) as client,
    ):
        wait_for(lambda: online_report(client).get("status") == "on", 60, "on")
        for content, headers, status, text in cases:
            r = client.post("/events", content=content, headers=AUTH | headers)
            assert r.status_code == status, (content[:80], r.status_code, r.text[:300])
            assert text in r.json()["detail"], (content[:80], r.json()["detail"][:300])
        r = client.post("/events", json=good)
        assert r.status_code == 401 and "bearer token required" in r.json()["detail"]
        r = client.post("/events", json=good, headers={"Authorization": "Bearer nope"})
        assert r.status_code == 403 and "wrong token" in r.json()["detail"]
        assert online_report(client)["log_position"] == 0 and EventsLog(store).head() == 0
        ok = client.post("/events", json=good, headers=AUTH)
        assert ok.status_code == 200 and ok.json()["segment"] == 1
        assert client.post("/predict", json={"customer_id": "c1"}).status_code == 200
