"""A contender fitted by its own unit travels to the train stage through the store: the unit
publishes its manifest and bundle under the run, and the train stage registers that bundle
(checked against its sha256) instead of fitting the family again; a family without a published
contender is fitted by the train stage itself."""

from __future__ import annotations

import pytest
import torch

from infra.layout import contender_bundle_key, stage_manifest_key
from infra.settings import HybridflowSettings
from infra.storage.registry import ModelRegistry
from infra.storage.store import LocalFolderStore
from tasks.ml.models import get_family
from tasks.policy.contending import TrainingOptions
from tasks.reporting.records import contender_stage
from tasks.stages.train_process import contender_for_run, train_for_run
from tests.fixtures.synthetic_snapshot import publish_synthetic_snapshot

SETTINGS = HybridflowSettings(train={"families": ["logistic", "gbm"], "threads": 1})


@pytest.fixture
def store(tmp_path):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield LocalFolderStore(tmp_path / "store")
    torch.set_num_threads(threads)


def test_the_train_stage_registers_what_the_contender_unit_published(store, monkeypatch):
    publish_synthetic_snapshot(store, "run-1", rows=3000, seed=3)
    unit = contender_for_run(
        store,
        "run-1",
        SETTINGS,
        "gbm",
        device_preference="cpu",
        options=TrainingOptions(pool="cpu-pool"),
    )
    assert unit is not None and unit.report.name == "contender-gbm" and not unit.reused
    assert set(unit.bundle.values()) == {
        contender_bundle_key("run-1", "gbm", name) for name in unit.manifest.files
    }
    store.put_bytes(
        stage_manifest_key("run-1", contender_stage("gbm")), unit.model_dump_json().encode()
    )

    fitted: list[str] = []
    for kind in ("gbm", "logistic"):
        family = get_family(kind)
        original = type(family).fit

        def recording(self, spec, job, _original=original):
            fitted.append(spec.kind)
            return _original(self, spec, job)

        monkeypatch.setattr(type(family), "fit", recording)

    output = train_for_run(store, "run-1", SETTINGS, device_preference="cpu")
    assert output is not None
    # gbm came from its unit; the train stage fitted (and backtested) only logistic
    assert "gbm" not in fitted and "logistic" in fitted
    rows = {r.family: r for r in output.result.leaderboard}
    assert rows["gbm"].version == unit.manifest.version
    assert rows["gbm"].pool == "cpu-pool"
    registered = ModelRegistry(store).get(unit.manifest.version)
    assert registered.files == unit.manifest.files and registered.leaderboard


def test_a_tampered_bundle_is_refused(store):
    publish_synthetic_snapshot(store, "run-2", rows=3000, seed=4)
    unit = contender_for_run(store, "run-2", SETTINGS, "logistic", device_preference="cpu")
    assert unit is not None
    store.put_bytes(
        stage_manifest_key("run-2", "contender-logistic"), unit.model_dump_json().encode()
    )
    (key,) = unit.bundle.values()
    store.put_bytes(key, store.get_bytes(key) + b" ")
    with pytest.raises(ValueError, match="does not match"):
        train_for_run(store, "run-2", SETTINGS.model_copy(update={}), device_preference="cpu")


def test_a_train_stage_retried_after_registering_reads_the_registered_version(store):
    publish_synthetic_snapshot(store, "run-3", rows=3000, seed=5)
    settings = HybridflowSettings(train={"families": ["logistic"], "threads": 1})
    unit = contender_for_run(store, "run-3", settings, "logistic", device_preference="cpu")
    assert unit is not None
    store.put_bytes(
        stage_manifest_key("run-3", "contender-logistic"), unit.model_dump_json().encode()
    )
    first = train_for_run(store, "run-3", settings, device_preference="cpu")
    again = train_for_run(store, "run-3", settings, device_preference="cpu")
    assert first is not None and again is not None
    assert again.result.model_version == first.result.model_version == unit.manifest.version
