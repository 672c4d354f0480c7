"""The good events validated in process are a file per share of the customers, and their
manifest says so; the in-process features take those files as their passes (no share of the
events written again) and publish what one pass over the same events publishes."""

from __future__ import annotations

import datetime as dt

import pyarrow.parquet as pq
import pytest

import tasks.data.features_duckdb as features_duckdb
import tasks.data.validation_duckdb as validation_duckdb
from infra.storage.arrow_datasets import read_table
from infra.storage.datasets import CUSTOMER_FILES_KEY, customer_files, read_dataset_manifest
from tasks.data.cutoffs import Origins, pipeline_cutoffs
from tasks.data.demo_events import DemoDataParams, generate_demo_events
from tasks.data.input_formats import InputOptions, inspect_events
from tasks.definitions.contract import CONTRACT_COLUMNS
from tasks.engines.feature_frame import FeatureOutput
from tasks.engines.in_process.features import InProcessFeatureFrame
from tasks.engines.in_process.validate import publish_validated_in_process

AS_OF = dt.date(2025, 6, 30)


@pytest.fixture
def events(tmp_path):
    out = tmp_path / "events"
    generate_demo_events(DemoDataParams(customers=300, days=400, seed=8), out)
    return out


def _published(store, events, run_id: str, per_pass: int, monkeypatch) -> list[list]:
    monkeypatch.setattr(validation_duckdb, "EVENTS_PER_PASS", per_pass)
    monkeypatch.setattr(features_duckdb, "EVENTS_PER_PASS", per_pass)
    good, _, _ = publish_validated_in_process(store, run_id, inspect_events(events, InputOptions()))
    cutoffs = pipeline_cutoffs(AS_OF, 90, Origins(count=2, stride_days=30))
    outputs = [
        FeatureOutput(cutoffs.train, f"{run_id}/training"),
        FeatureOutput((cutoffs.score,), f"{run_id}/scoring"),
    ]
    built = []
    original = features_duckdb.InProcessFeatures._build_by_files

    def by_files(self, files, wide, events_per_pass):
        built.append(len(files))
        return original(self, files, wide, events_per_pass)

    monkeypatch.setattr(features_duckdb.InProcessFeatures, "_build_by_files", by_files)
    with InProcessFeatureFrame(store, good.prefix, outputs, set(CONTRACT_COLUMNS)) as frame:
        published = [frame.publish(output)[0] for output in outputs]
    assert built == [len(good.files)]  # the validated files, as they lie
    return [good, *(read_table(store, m).to_pylist() for m in published)]


def test_validated_files_are_whole_customers_and_the_features_passes(
    local_store, events, monkeypatch
):
    rows = pq.read_metadata(next(events.glob("*.parquet"))).num_rows
    one = _published(local_store, events, "one", rows * 10, monkeypatch)
    many = _published(local_store, events, "many", rows // 3, monkeypatch)
    assert len(one[0].files) == 1 and len(many[0].files) >= 3
    for good in (one[0], many[0]):
        assert good.metadata[CUSTOMER_FILES_KEY] is True and customer_files(good)
        assert customer_files(read_dataset_manifest(local_store, good.prefix))
    for a, b in zip(one[1:], many[1:], strict=True):
        assert len(a) == len(b) > 50
        for x, y in zip(a, b, strict=True):
            assert x.keys() == y.keys()
            for key, value in x.items():
                assert y[key] == (
                    pytest.approx(value, rel=1e-9) if isinstance(value, float) else value
                )
