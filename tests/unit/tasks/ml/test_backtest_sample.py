"""The backtest's refit at T-2H on a label-free sample of the earlier snapshot's training rows
(tasks.ml.backtest.backtest_sample, SnapshotStream.train_sample): what keeps its cost bounded
at scale without letting anything after its cutoff decide what it sees."""

from __future__ import annotations

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from infra.compute.devices import Device
from infra.settings import TrainingSettings
from infra.storage.datasets import local_dataset_dir, read_dataset_manifest
from infra.storage.store import LocalFolderStore
from tasks.ml import backtest as backtest_module
from tasks.ml.backtest import (
    backtest_epochs,
    backtest_fit_job,
    backtest_fit_plan,
    backtest_sample,
    train_backtest_model,
)
from tasks.ml.network_plan import network_plan
from tasks.ml.normalizer import Normalizer
from tasks.ml.snapshot_reader import SnapshotStream
from tests.fixtures.synthetic_snapshot import publish_synthetic_snapshot, synthetic_stream


@pytest.fixture(scope="module")
def earlier(tmp_path_factory):
    store = LocalFolderStore(tmp_path_factory.mktemp("sample-store"))
    _, prepared = publish_synthetic_snapshot(store, "earlier", rows=6000, seed=5)
    return synthetic_stream(store, prepared, chunk_rows=500)


def _train_ids(data: SnapshotStream) -> set[str]:
    ids: set[str] = set()
    for path in data.splits["train"].files:
        ids.update(pq.read_table(path, columns=["customer_id"])["customer_id"].to_pylist())
    return ids


def _kept_labels(data: SnapshotStream, split: str) -> np.ndarray:
    return np.concatenate([y for _, y in data.chunks(split)])


def test_a_train_sample_keeps_a_fixed_share_of_customers_and_val_and_test_whole(earlier):
    data, _ = earlier
    sample = data.train_sample(0.25)
    rows = data.rows("train")
    assert 0.18 * rows < sample.rows("train") < 0.32 * rows
    assert sum(len(y) for _, y in sample.chunks("train")) == sample.rows("train")
    assert sum(len(y) for _, y in sample.chunks("train", seed=3, epoch=2)) == sample.rows("train")
    for split in ("val", "test"):
        assert sample.rows(split) == data.rows(split)
        assert np.array_equal(_kept_labels(sample, split), _kept_labels(data, split))
    # the same customers every time, and views of the sample keep it
    again = data.train_sample(0.25)
    assert np.array_equal(_kept_labels(again, "train"), _kept_labels(sample, "train"))
    assert sample.with_features(data.features[:3]).rows("train") == sample.rows("train")
    assert data.train_sample(1.0) is data


def test_which_customers_a_sample_keeps_never_depends_on_labels(earlier, tmp_path):
    data, _ = earlier
    # the same snapshot with every label flipped: the kept rows are the same customers
    flipped = tmp_path / "flipped"
    for split, info in data.splits.items():
        (flipped / f"split={split}").mkdir(parents=True)
        for path in info.files:
            table = pq.read_table(path)
            label = pc.subtract(1, table["label"])
            table = table.set_column(table.schema.get_field_index("label"), "label", label)
            pq.write_table(table, flipped / f"split={split}" / path.name)
    other = SnapshotStream(flipped, data.features, chunk_rows=500)
    a, b = data.train_sample(0.3), other.train_sample(0.3)
    assert a.rows("train") == b.rows("train")
    ya, yb = _kept_labels(a, "train"), _kept_labels(b, "train")
    assert np.array_equal(ya, 1.0 - yb)
    xa = np.concatenate([x for x, _ in a.chunks("train")])
    xb = np.concatenate([x for x, _ in b.chunks("train")])
    assert np.array_equal(xa, xb)
    assert len(_train_ids(data)) == data.rows("train")


def test_the_backtest_fits_on_a_sample_only_above_its_row_cap(earlier):
    data, _ = earlier
    rows = data.rows("train")
    assert backtest_sample(data, 0) is data
    assert backtest_sample(data, rows) is data
    cut = backtest_sample(data, rows // 4)
    assert 0.18 * rows < cut.rows("train") < 0.32 * rows
    assert cut.rows("val") == data.rows("val")


def test_a_backtest_fit_sees_only_the_sampled_rows(earlier, monkeypatch):
    data, normalizer = earlier
    seen: list[int] = []
    family = backtest_module.get_family("logistic")
    real_fit = type(family).fit

    def counting_fit(self, spec, job):
        seen.append(job.data.rows("train"))
        return real_fit(self, spec, job)

    monkeypatch.setattr(type(family), "fit", counting_fit)
    settings = TrainingSettings(backtest_max_rows=data.rows("train") // 4)
    model = train_backtest_model(data, normalizer, family.spec({}), settings, Device())
    assert model is not None
    assert seen and seen[0] < data.rows("train") // 3


def test_a_sampled_backtest_fit_is_planned_for_the_unsampled_rows_and_its_epochs_bounded(
    earlier,
):
    data, normalizer = earlier
    rows = data.rows("train")
    settings = TrainingSettings(backtest_max_rows=rows // 4, max_epochs=30, patience=3)
    job = backtest_fit_job(data, normalizer, settings, Device(), production_rows=rows)
    sample = job.data.rows("train")
    assert sample < rows // 3 and job.plan_rows == rows
    # planned like the production fit, whatever its rows
    other = backtest_fit_job(data, normalizer, settings, Device(), 3 * rows)
    assert other.plan_rows == 3 * rows
    # the production fit passes at least 4 epochs x its rows; the sample may pass no more
    assert job.settings.max_epochs == backtest_epochs(settings, sample, rows) == 4 * rows // sample
    assert job.settings.max_epochs * sample <= 4 * rows
    # a production fit on many more rows leaves more epochs, never more than max_epochs
    assert backtest_epochs(settings, sample, 100 * rows) == 30
    assert backtest_epochs(settings, 10 * rows, rows) == 1
    assert backtest_epochs(TrainingSettings(max_epochs=2, patience=3), 100, 100) == 2
    # nothing sampled (at most backtest_max_rows rows): the fit as the run does it
    whole = backtest_fit_job(data, normalizer, TrainingSettings(backtest_max_rows=rows), Device())
    assert whole.data is data and whole.plan_rows is None
    assert whole.settings == TrainingSettings(backtest_max_rows=rows)


def test_the_backtest_network_fit_is_planned_like_the_production_fit_at_30m_events():
    """The 30M-event run's row counts (1,097,638 training rows at T-H, 821,246 at T-2H, a
    500,822-row sample): the backtest's plan is the production fit's (batch 16,384 on both
    cores), not that of the T-2H rows it stands for (batch 8,192 on one thread) nor of its
    sample (4,096), and its epochs pass at most (patience + 1) production epochs' examples."""
    settings = TrainingSettings()
    production, earlier, sample = 1_097_638, 821_246, 500_822
    plan = backtest_fit_plan(
        settings, earlier_rows=earlier, sample_rows=sample, production_rows=production
    )
    assert plan.plan_rows == production

    def network(rows: int):
        return network_plan(settings, train_rows=rows, parameters=5121, learning_rate=2e-3, cores=2)

    assert network(plan.plan_rows) == network(production)
    assert (network(production).batch_size, network(production).threads) == (16_384, 2)
    assert (network(earlier).batch_size, network(earlier).threads) == (8_192, 1)
    assert plan.max_epochs == 4 * production // sample == 8
    # unsampled: planned like the production fit, every epoch allowed; alone: as before
    whole = backtest_fit_plan(
        settings, earlier_rows=earlier, sample_rows=earlier, production_rows=production
    )
    assert whole == type(plan)(plan_rows=production, max_epochs=settings.max_epochs)
    alone = backtest_fit_plan(
        settings, earlier_rows=earlier, sample_rows=sample, production_rows=None
    )
    assert alone.plan_rows == earlier and alone.max_epochs == 4 * earlier // sample
    assert backtest_fit_plan(
        settings, earlier_rows=earlier, sample_rows=earlier, production_rows=None
    ) == type(plan)(plan_rows=None, max_epochs=settings.max_epochs)


@pytest.fixture(scope="module")
def large_earlier(tmp_path_factory):
    """Enough training rows (~140k) that a fit on all of them gets a larger batch."""
    store = LocalFolderStore(tmp_path_factory.mktemp("large-sample-store"))
    _, prepared = publish_synthetic_snapshot(store, "large", rows=200_000, seed=6)
    manifest = read_dataset_manifest(store, prepared.snapshot_prefix)
    normalizer = Normalizer.model_validate(manifest.metadata["normalizer"])
    return SnapshotStream(local_dataset_dir(store, manifest), normalizer.features), normalizer


def test_a_sampled_backtest_network_fit_steps_like_the_production_fit(large_earlier):
    """The mlp's backtest on a 10% sample runs the batch the production fit (here on all the
    rows) runs, not the sample's own smaller one, within its epochs."""
    data, normalizer = large_earlier
    rows = data.rows("train")
    settings = TrainingSettings(backtest_max_rows=rows // 10, threads=1, max_epochs=4)
    family = backtest_module.get_family("mlp")
    job = backtest_fit_job(data, normalizer, settings, Device(), rows)
    sample = job.data.rows("train")
    outcome = family.fit(family.spec({}), job)
    full = network_plan(settings, train_rows=rows, parameters=1, learning_rate=1e-3)
    own = network_plan(settings, train_rows=sample, parameters=1, learning_rate=1e-3)
    assert outcome.record["batch_size"] == full.batch_size > own.batch_size
    assert outcome.record["epochs"] <= 4
    assert outcome.record["samples_seen"] <= 4 * sample
