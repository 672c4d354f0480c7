"""The S3 backend when answers get lost (moto's server behind a proxy that drops answers on
127.0.0.1): a conditional write that landed is not reported as a concurrent promotion, a genuine
conflict still is, and datasets published by compare-and-swap keep their chain."""

from __future__ import annotations

import logging
from pathlib import Path

import boto3
import pytest

from infra.layout import alias_key
from infra.storage.datasets import find_dataset, publish_dataset
from infra.storage.registry import ModelRegistry, PromotionConflict
from infra.storage.store import PreconditionFailed
from infra.storage.store_s3 import S3Store
from tests.fixtures.lossy_proxy import LossyProxy

pytestmark = pytest.mark.integration
BUCKET = "hf-faults"
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@pytest.fixture(scope="module")
def moto_endpoint():
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    ).create_bucket(Bucket=BUCKET)
    yield endpoint
    server.stop()


def _store_via(endpoint: str, prefix: str, monkeypatch) -> S3Store:
    for key, value in (CREDENTIALS | {"AWS_ENDPOINT_URL": endpoint}).items():
        monkeypatch.setenv(key, value)
    return S3Store(f"s3://{BUCKET}/{prefix}", retries=3, backoff_s=0.01)


def _conditional_put_of(key: str):
    def pick(method: str, path: str, headers: dict[str, str]) -> bool:
        conditional = {h.lower() for h in headers} & {"if-match", "if-none-match"}
        return method == "PUT" and path.split("?")[0].endswith(key) and bool(conditional)

    return pick


def test_a_promotion_whose_answer_was_lost_is_not_a_conflict(moto_endpoint, monkeypatch):
    direct = ModelRegistry(_store_via(moto_endpoint, "lost-answer", monkeypatch))
    v1, v2 = (direct.register({"model.pt": f"w{i}".encode()}).version for i in range(2))
    with LossyProxy(moto_endpoint, _conditional_put_of(alias_key("production")), times=2) as proxy:
        registry = ModelRegistry(_store_via(proxy.url, "lost-answer", monkeypatch))
        registry.set_alias(v1, "create-only write, answer lost", expected_version=None)
        registry.set_alias(v2, "compare-and-swap, answer lost", expected_version=v1)
        assert len(proxy.lost) == 2, proxy.lost
    record = direct.alias()
    assert record.version == v2
    assert [(c.version, c.action) for c in record.history] == [(v1, "promote"), (v2, "promote")]


def test_a_genuine_conflict_is_still_one(moto_endpoint, monkeypatch):
    store = _store_via(moto_endpoint, "genuine", monkeypatch)
    registry = ModelRegistry(store)
    v1, v2, v3 = (registry.register({"model.pt": f"w{i}".encode()}).version for i in range(3))
    registry.set_alias(v1, "first")
    _, stale = store.get_with_token(alias_key("production"))
    registry.set_alias(v2, "someone else")
    with pytest.raises(PreconditionFailed):
        store.put_bytes_if(alias_key("production"), b"{}", if_match=stale)
    with pytest.raises(PromotionConflict):
        registry.set_alias(v3, "decided against v1", expected_version=v1)
    assert registry.alias().version == v2


def test_datasets_published_on_s3_keep_their_chain(moto_endpoint, monkeypatch, tmp_path):
    store = _store_via(moto_endpoint, "datasets", monkeypatch)
    prefix = "predictions/as_of=2026-01-31"
    published = []
    for i in range(3):
        local = Path(tmp_path / f"gen{i}")
        local.mkdir()
        (local / "part-0.parquet").write_text(f"gen {i}")
        published.append(publish_dataset(store, local, prefix, rows=1).data_prefix)
    manifest = find_dataset(store, prefix)
    assert (manifest.data_prefix, manifest.previous_data_prefix) == (published[2], published[1])
    folders = {k.rsplit("/", 1)[0] for k in store.list(prefix) if "/data-" in k}
    assert folders == {published[1], published[2]}
