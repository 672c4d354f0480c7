"""``hybridflow serve`` as a real process on a loopback port, driven over real HTTP.

One server for the module (sample registry built without Spark, 0.2 s poll interval):
every kind of bad input, the admin token, and a model lifecycle under concurrent load —
promotion, rollback, a corrupt version and a NaN-producing version (both refused), recovery.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections import defaultdict

import httpx
import numpy as np
import pytest
from serving_process import metric_value, running_server, wait_for

from infra.layout import version_file_key
from infra.storage.registry import ModelRegistry
from infra.storage.store import LocalFolderStore
from tasks.ml.models import load_model, predict_proba
from tests.fixtures.serving_sample import (
    SAMPLE_FEATURES,
    point_alias_unverified,
    publish_sample_snapshot,
    register_sample_model,
    sample_feature_table,
)

pytestmark = pytest.mark.e2e

TOKEN = "test-admin-token-7f3a"
MAX_ITEMS = 8
MAX_BODY = 16_384


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A sample store (500 customers, production = v1) and a server process over it."""
    root = tmp_path_factory.mktemp("serving")
    store = LocalFolderStore(root / "store")
    table = sample_feature_table(500, seed=3)
    publish_sample_snapshot(store, table, dt.date(2025, 12, 31))
    v1 = register_sample_model(store, table, seed=1)
    env = {
        "HYBRIDFLOW_SERVE__ADMIN_TOKEN": TOKEN,
        "HYBRIDFLOW_SERVE__POLL_INTERVAL_S": "0.2",
        "HYBRIDFLOW_SERVE__MAX_BATCH_ITEMS": str(MAX_ITEMS),
        "HYBRIDFLOW_SERVE__MAX_BODY_BYTES": str(MAX_BODY),
    }
    with running_server(root / "store", root / "work", env) as server:
        with httpx.Client(base_url=server.url, timeout=10) as client:
            wait_for(lambda: client.get("/ready").status_code == 200, 30, "/ready")
            yield {"server": server, "client": client, "store": store, "table": table, "v1": v1}


def _features_of(table, row: int) -> dict[str, float]:
    return {f: float(table.column(f)[row].as_py()) for f in SAMPLE_FEATURES}


def _expected_score(store, version: str, features: dict[str, float]) -> float:
    manifest, files = ModelRegistry(store).read_files(version)
    model = load_model(files, manifest.files)
    x = np.asarray([[features[f] for f in model.features]], dtype=np.float32)
    return float(predict_proba(model, x)[0])


def test_scores_match_the_registry_model(served):
    client, table, v1 = served["client"], served["table"], served["v1"]
    features = _features_of(table, 7)
    by_id = client.post("/predict", json={"customer_id": "c000007"})
    by_features = client.post("/predict", json={"features": features})
    assert by_id.status_code == 200 and by_features.status_code == 200
    a, b = by_id.json(), by_features.json()
    assert a["model_version"] == b["model_version"] == v1
    assert a["latency_ms"] > 0
    expected = _expected_score(served["store"], v1, features)
    assert a["score"] == pytest.approx(expected, abs=1e-6)
    assert b["score"] == pytest.approx(expected, abs=1e-6)

    batch = client.post(
        "/predict",
        json={
            "items": [
                {"customer_id": "c000007"},
                {"features": features},
                {"customer_id": "c000001"},
            ]
        },
    )
    assert batch.status_code == 200, batch.text
    items = batch.json()["items"]
    assert len(items) == 3
    assert [i["model_version"] for i in items] == [v1] * 3
    assert items[0]["score"] == pytest.approx(expected, abs=1e-6)
    assert items[1]["score"] == pytest.approx(expected, abs=1e-6)
    assert all("latency_ms" in i for i in items)


def _full(table, **override) -> dict:
    features = _features_of(table, 0)
    features.update(override)
    return features


def test_bad_input_gets_a_clear_answer_and_the_service_keeps_running(served):
    client, table = served["client"], served["table"]
    full = _features_of(table, 0)
    without_tenure = {k: v for k, v in full.items() if k != "tenure_days"}
    raw = '{"features": {' + ", ".join(f'"{k}": {v!r}' for k, v in full.items())
    cases = [
        # (body bytes, expected status, text that must be in the 'detail')
        (b"{not json", 422, "body: body is not valid JSON"),
        (b"", 422, "body: body is not valid JSON"),
        (b"[1, 2]", 422, "body"),
        (b'{"customer_id": 12.5}', 422, "customer_id: must be a string or an integer"),
        (b'{"customer_id": 123}', 404, "customer_id: unknown customer '123'"),
        (b'{"customer_id": ""}', 422, "customer_id"),
        (
            raw.replace('"recency_days": ', '"recency_days": "', 1).replace(", ", '", ', 1).encode()
            + b"}}",
            422,
            "features.recency_days",
        ),
        (
            raw.encode() + b', "recency_days": NaN}}',
            422,
            "features.recency_days: must be a finite number",
        ),
        (
            raw.encode() + b', "recency_days": 1e999}}',
            422,
            "features.recency_days: must be a finite number",
        ),
        (
            raw.encode() + b', "n_events": -Infinity}}',
            422,
            "features.n_events: must be a finite number",
        ),
        (raw.encode() + b', "n_events": true}}', 422, "features.n_events"),
        (raw.encode() + b', "n_events": 1e39}}', 422, "features.n_events: out of float32 range"),
        (raw.encode() + b', "bogus_feature": 1}}', 422, "features.bogus_feature: unknown feature"),
        (
            httpx.Request("POST", "/", json={"features": without_tenure}).content,
            422,
            "features.tenure_days: missing feature(s) tenure_days",
        ),
        (b'{"customer_id": "c000001", "features": {}}', 422, "exactly one of"),
        (b"{}", 422, "exactly one of"),
        (b'{"customer_id": "c000001", "colour": "red"}', 422, "colour: unknown field"),
        (b'{"items": []}', 422, "'items' must not be empty"),
        (
            b'{"items": [{"customer_id": "c000001"}, {"features": {"x": "1"}}]}',
            422,
            "items[1].features.x",
        ),
        (
            b'{"items": [{"customer_id": "c000001"}, {"features": {"bogus": 1}}]}',
            422,
            "items[1].features.bogus: unknown feature",
        ),
        (
            b'{"customer_id": "no-such-customer"}',
            404,
            "customer_id: unknown customer 'no-such-customer'",
        ),
        (
            b'{"items": [{"customer_id": "c000001"}, {"customer_id": "nope"}]}',
            404,
            "items[1].customer_id: unknown customer",
        ),
        (
            b'{"items": [' + b", ".join([b'{"customer_id": "c000001"}'] * (MAX_ITEMS + 1)) + b"]}",
            413,
            f"items: {MAX_ITEMS + 1} items; at most {MAX_ITEMS}",
        ),
        (
            b'{"customer_id": "' + b"x" * (MAX_BODY + 10) + b'"}',
            413,
            f"body: larger than {MAX_BODY} bytes",
        ),
    ]
    for body, status, text in cases:
        r = client.post("/predict", content=body, headers={"content-type": "application/json"})
        assert r.status_code == status, (body[:120], r.status_code, r.text)
        assert text in r.json()["detail"], (body[:120], r.json())

    def chunks():  # no Content-Length: counted as it arrives
        for _ in range(10):
            yield b" " * (MAX_BODY // 4)

    r = client.post("/predict", content=chunks())
    assert r.status_code == 413 and "larger than" in r.json()["detail"]

    assert client.get("/health").json() == {"status": "ok"}
    ok = client.post("/predict", json={"customer_id": "c000002"})
    assert ok.status_code == 200
    metrics = client.get("/metrics").text
    assert (
        metric_value(metrics, "hybridflow_serving_requests_total", route="/predict", status="422")
        >= 19
    )
    assert (
        metric_value(metrics, "hybridflow_serving_requests_total", route="/predict", status="404")
        >= 2
    )
    assert (
        metric_value(metrics, "hybridflow_serving_requests_total", route="/predict", status="413")
        >= 3
    )
    assert (
        metric_value(metrics, "hybridflow_serving_request_duration_seconds_count", route="/predict")
        >= 25
    )
    assert served["server"].process.poll() is None


def test_reload_requires_the_bearer_token(served):
    client, v1 = served["client"], served["v1"]
    assert client.post("/admin/reload").status_code == 401
    assert (
        client.post("/admin/reload", headers={"Authorization": f"Basic {TOKEN}"}).status_code == 401
    )
    assert (
        client.post("/admin/reload", headers={"Authorization": "Bearer wrong"}).status_code == 403
    )
    ok = client.post("/admin/reload", headers={"Authorization": f"Bearer {TOKEN}"})
    assert ok.status_code == 200
    assert ok.json()["model_version"] == v1
    assert TOKEN not in served["server"].log()


class Load:
    """Threads that POST /predict without pause, recording every answer's status and version."""

    def __init__(self, url: str, threads: int = 4) -> None:
        self.url = url
        self.stop = threading.Event()
        self.seen: dict[int, list[tuple[int, str | None]]] = defaultdict(list)
        self.errors: list[str] = []
        self.threads = [threading.Thread(target=self._run, args=(i,)) for i in range(threads)]

    def _run(self, i: int) -> None:
        with httpx.Client(base_url=self.url, timeout=10) as client:
            n = 0
            while not self.stop.is_set():
                n += 1
                try:
                    r = client.post("/predict", json={"customer_id": f"c{(i * 97 + n) % 500:06d}"})
                    version = r.json().get("model_version") if r.status_code == 200 else None
                    self.seen[i].append((r.status_code, version))
                except Exception as exc:  # a dropped request is a failure too
                    self.errors.append(repr(exc))

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=30)

    def versions(self) -> list[str | None]:
        return [v for answers in self.seen.values() for _, v in answers]

    def assert_no_failures(self) -> None:
        bad = [s for answers in self.seen.values() for s, _ in answers if s != 200]
        assert not self.errors and not bad, (self.errors[:3], bad[:5])


def _serving(client) -> str:
    return client.get("/ready").json()["model_version"]


def test_model_lifecycle_under_load(served):
    client, store, table = served["client"], served["store"], served["table"]
    registry = ModelRegistry(store)
    v1 = served["v1"]
    assert _serving(client) == v1

    # Promotion while clients keep sending: no failed request, every client goes v1 -> v2 once.
    with Load(client.base_url) as load:
        # every client answered before the swap (a thread can start late on a busy machine)
        wait_for(
            lambda: len(load.seen) == len(load.threads) and len(load.versions()) > 20,
            30,
            "every client to get answers",
        )
        v2 = register_sample_model(store, table, seed=2)
        wait_for(
            lambda: all(answers[-1][1] == v2 for answers in list(load.seen.values())),
            30,
            "every client's answers from the promoted model",
        )
        n = len(load.versions())
        wait_for(lambda: len(load.versions()) > n + 20, 30, "more answers after the swap")
    load.assert_no_failures()
    for answers in load.seen.values():
        versions = [v for _, v in answers]
        assert versions[0] == v1 and versions[-1] == v2
        switch = versions.index(v2)
        assert set(versions[:switch]) == {v1} and set(versions[switch:]) == {v2}
    metrics = client.get("/metrics").text
    assert metric_value(metrics, "hybridflow_serving_model_info", version=v2) == 1
    assert metric_value(metrics, "hybridflow_serving_model_info", version=v1) == 0
    reloads = metric_value(metrics, "hybridflow_serving_model_reloads_total")
    assert reloads >= 2  # startup + promotion

    # Rollback of the alias is picked up the same way.
    registry.rollback()
    wait_for(lambda: _serving(client) == v1, 30, "rollback to v1")

    with Load(client.base_url) as load:
        # A version whose weights file no longer matches its sha256: refused, v1 keeps serving.
        v3 = register_sample_model(store, table, seed=3, promote=False)
        weights = store.local_path(version_file_key(v3, "model.pt"))
        weights.write_bytes(weights.read_bytes()[:-64] + b"\0" * 64)
        point_alias_unverified(store, v3, "damaged after its promotion")
        wait_for(
            lambda: (
                metric_value(
                    client.get("/metrics").text,
                    "hybridflow_serving_model_reload_failures_total",
                    kind="model",
                    reason="checksum",
                )
                >= 1
            ),
            30,
            "the checksum refusal in /metrics",
        )
        ready = client.get("/ready").json()
        assert ready["model_version"] == v1 and v3 in ready["last_reload_error"]

        # A version that loads but scores NaN on the warm-up batch: refused too.
        v4 = register_sample_model(store, table, seed=4, nan_weights=True)
        wait_for(
            lambda: (
                metric_value(
                    client.get("/metrics").text,
                    "hybridflow_serving_model_reload_failures_total",
                    kind="model",
                    reason="warmup_nan",
                )
                >= 1
            ),
            30,
            "the warm-up refusal in /metrics",
        )
        forced = client.post("/admin/reload", headers={"Authorization": f"Bearer {TOKEN}"})
        assert forced.status_code == 200
        assert forced.json()["model_version"] == v1
        assert v4 in forced.json()["refused"][0]
        n = len(load.versions())
        wait_for(lambda: len(load.versions()) > n + 20, 30, "answers after the refusals")
    load.assert_no_failures()
    assert set(load.versions()) == {v1}
    metrics = client.get("/metrics").text
    # Refused versions are not retried on every poll: one refusal per alias move (+1 forced).
    assert (
        metric_value(
            metrics,
            "hybridflow_serving_model_reload_failures_total",
            kind="model",
            reason="checksum",
        )
        == 1
    )
    assert (
        metric_value(
            metrics,
            "hybridflow_serving_model_reload_failures_total",
            kind="model",
            reason="warmup_nan",
        )
        == 2
    )
    log = served["server"].log()
    assert f"model refused (checksum): model {v3}" in log
    assert "still serving " + v1 in log

    # After the refusals a good version is picked up again.
    registry.set_alias(v2, "back to a good model")
    wait_for(lambda: _serving(client) == v2, 30, "recovery to v2")
    assert client.post("/predict", json={"customer_id": "c000003"}).json()["model_version"] == v2
