"""The model holder against S3 over HTTP (moto's server mode on 127.0.0.1): loads, skips an
unchanged alias by its ETag, swaps a promotion in, and keeps serving when S3 goes away."""

from __future__ import annotations

import datetime as dt
import logging

import boto3
import pytest

from infra.storage.store import S3Store
from serving.holder import ModelHolder
from serving.metrics import ServingMetrics
from tests.fixtures.serving_sample import (
    publish_sample_snapshot,
    register_sample_model,
    sample_feature_table,
)

pytestmark = pytest.mark.integration
BUCKET = "hf-serving"


def test_holder_follows_the_alias_on_s3_and_survives_an_outage(monkeypatch):
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://{host}:{port}")
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
        boto3.client("s3").create_bucket(Bucket=BUCKET)
        store = S3Store(f"s3://{BUCKET}/store", retries=1, backoff_s=0.05)
        table = sample_feature_table(200, seed=9)
        publish_sample_snapshot(store, table, dt.date(2025, 12, 31))
        v1 = register_sample_model(store, table, seed=1)

        metrics = ServingMetrics()
        holder = ModelHolder(store, metrics)
        holder.refresh()
        first = holder.state
        assert first.model.version == v1 and first.snapshot.rows == 200
        holder.refresh()
        assert holder.state is first  # same ETag: nothing reloaded

        v2 = register_sample_model(store, table, seed=2)
        report = holder.refresh()
        assert holder.state.model.version == v2
        assert report.changed == [f"model {v1} -> {v2}"]
    finally:
        server.stop()

    report = holder.refresh()  # S3 is gone: refused, counted, still serving v2
    assert holder.state.model.version == v2
    assert report.refused and report.model_version == v2
    failures = metrics.registry.get_sample_value(
        "hybridflow_serving_model_reload_failures_total", {"kind": "model", "reason": "error"}
    )
    assert failures == 1
