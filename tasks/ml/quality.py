"""The train stage's judgement of a fitted model: calibration fitted on the val split, the
baseline and the candidate compared on the test split of the newest origin's examples (T-H), and
the out-of-time backtest on the snapshot the preprocess stage published for the origins from T-2H
down, judged on every example at T-H (skipped, with the reason, without one)."""

from __future__ import annotations

import datetime as dt
import logging
from typing import Protocol

from infra.compute.devices import Device
from infra.settings import HybridflowSettings
from infra.storage.datasets import local_dataset_dir, read_dataset_manifest, release_local_dir
from infra.storage.store import ObjectStore
from tasks.ml.backtest import assess, backtest_comparison
from tasks.ml.evaluation import BacktestReport, BacktestWindows, ModelEvaluation
from tasks.ml.models import FamilySpec, FittedModel
from tasks.ml.normalizer import Normalizer
from tasks.ml.snapshot_reader import SPLITS, SnapshotStream

log = logging.getLogger(__name__)


class PreparedSnapshots(Protocol):
    """What the judgement reads of the preprocess stage's result (its ``PreprocessResult``)."""

    @property
    def backtest_snapshot_prefix(self) -> str | None: ...

    @property
    def backtest_skipped(self) -> str | None: ...


def judge_candidate(
    store: ObjectStore,
    prepared: PreparedSnapshots,
    model: FittedModel,
    spec: FamilySpec,
    data: SnapshotStream,
    settings: HybridflowSettings,
    device: Device,
    as_of: dt.date,
    horizon_days: int,
) -> tuple[FittedModel, ModelEvaluation]:
    """``model`` with its calibration set, and everything it is judged by: the test split of
    the examples at the newest origin (T-H), in time, and the backtest on all of them."""
    method = settings.train.calibration
    judged = data.newest_origin()
    calibration, test = assess(model, data, judged, ["test"], method)
    model = model.with_calibration(calibration)
    log.info(
        "%s calibration %s: test log loss %.4f -> %.4f, ECE %.4f -> %.4f (baseline %.4f, ECE %.4f)",
        spec.kind,
        calibration.describe(),
        test.model_uncalibrated.logloss,
        test.model.logloss,
        test.model_uncalibrated.ece,
        test.model.ece,
        test.baseline.logloss,
        test.baseline.ece,
    )
    backtest = run_backtest(
        store, prepared, judged, spec, settings, device, as_of, horizon_days, data.rows("train")
    )
    return model, ModelEvaluation(calibration=calibration, test=test, backtest=backtest)


def run_backtest(
    store: ObjectStore,
    prepared: PreparedSnapshots,
    data: SnapshotStream,
    spec: FamilySpec,
    settings: HybridflowSettings,
    device: Device,
    as_of: dt.date,
    horizon_days: int,
    production_rows: int | None = None,
) -> BacktestReport:
    """Fit ``spec``'s family on the backtest snapshot (origins from T-2H down) and judge it on
    ``data``, the run's examples at T-H (``production_rows``: the training rows of the
    production fit, which bound the backtest fit's examples when it samples)."""
    windows = BacktestWindows.of(as_of, horizon_days)
    if prepared.backtest_snapshot_prefix is None:
        reason = prepared.backtest_skipped or "no backtest snapshot was published"
        log.warning("backtest skipped: %s", reason)
        return BacktestReport(status="skipped", reason=reason, windows=windows)
    manifest = read_dataset_manifest(store, prepared.backtest_snapshot_prefix)
    normalizer = Normalizer.model_validate(manifest.metadata["normalizer"])
    local = local_dataset_dir(store, manifest)
    try:
        earlier = SnapshotStream(
            local,
            normalizer.features,
            chunk_rows=settings.train.stream_chunk_rows,
            cache_bytes=settings.train.stream_cache_mb << 20,
        )
        calibration, result = backtest_comparison(
            earlier,
            normalizer,
            data,
            spec,
            settings.train,
            device,
            settings.train.calibration,
            production_rows,
        )
        n_train, origins = earlier.rows("train"), earlier.origins()
    finally:
        release_local_dir(store, local)
    log.info(
        "%s backtest (fitted at %s, judged on (%s, %s]): AUC %.4f, log loss %.4f (uncalibrated "
        "%.4f, baseline %.4f), ECE %.4f",
        spec.kind,
        windows.train_features_until,
        windows.train_labels_until,
        windows.judged_labels_until,
        result.model.auc,
        result.model.logloss,
        result.model_uncalibrated.logloss,
        result.baseline.logloss,
        result.model.ece,
    )
    return BacktestReport(
        status="done",
        windows=windows,
        origins=origins,
        n_train=n_train,
        n_judged=sum(data.rows(s) for s in SPLITS),
        calibration=calibration,
        result=result,
    )
