"""Judging a trained model of any family against held-out labels: calibrate it, fit the baseline
beside it, and compare the three on the same rows — on the run's test split, and in the
out-of-time backtest, where a model of the same family fitted the same way one horizon earlier
is judged on the run's examples.

Which rows play which part is the whole point, so it is spelled out once here:

* calibration: fitted on the ``val`` split of the data the model was fitted on (held out from
  its fit; used only for early stopping);
* baseline: fitted on the ``train`` split of that same data;
* judged: the ``test`` split (in time) or every split of the next window (backtest).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from infra.compute.devices import Device
from infra.settings import CalibrationMethod, TrainingSettings
from tasks.ml.baseline import (
    BASELINE_FEATURES,
    LogisticBaseline,
    baseline_columns,
    fit_baseline,
)
from tasks.ml.calibration import (
    FITTED_METHODS,
    Calibration,
    calibration_that_pays,
    fit_calibration,
)
from tasks.ml.evaluation import CalibrationScore, ModelComparison
from tasks.ml.metrics import QualityMetrics, probability_metrics, quality_metrics
from tasks.ml.models import FamilySpec, FitJob, FittedModel, get_family
from tasks.ml.normalizer import Normalizer
from tasks.ml.snapshot_reader import SPLITS, SnapshotStream, memoised

log = logging.getLogger(__name__)


@dataclass
class ScoredRows:
    """Labels, the model's raw logits and the baseline's feature columns of some rows."""

    labels: np.ndarray
    logits: np.ndarray
    baseline_x: np.ndarray


def scored_rows(
    model: FittedModel | None, data: SnapshotStream, splits: Iterable[str]
) -> ScoredRows:
    """Stream ``splits`` of ``data`` once: labels, logits (empty without a model) and the
    baseline's columns (``x`` holds the model's inputs: its features, and the positions of the
    sequence columns a sequence model reads)."""
    if model is not None:
        data = data.with_features(model.features)
    columns = baseline_columns(data.features)
    ys, zs, xs = [], [], []
    for split in splits:
        for x, y in data.chunks(split):
            ys.append(y)
            xs.append(x[:, columns])
            if model is not None:
                zs.append(model.logits(x))
    return ScoredRows(
        labels=np.concatenate(ys).astype(np.float64),
        logits=np.concatenate(zs) if zs else np.empty(0),
        baseline_x=np.concatenate(xs),
    )


def compare_on(
    judged: ScoredRows,
    calibration: Calibration,
    held_out: ScoredRows,
    baseline: QualityMetrics,
) -> ModelComparison:
    """The calibrated and raw model on ``judged`` beside the ``baseline``'s figures on the same
    rows, plus every calibration method fitted on ``held_out`` and judged on them."""
    y, z = judged.labels, judged.logits
    raw = Calibration().probabilities(z)
    # the identity calibrates to the raw sigmoid, value for value: one set of figures
    calibrated = raw if calibration.method == "none" else calibration.probabilities(z)
    methods: dict[str, CalibrationScore] = {}
    for method in ("none", *FITTED_METHODS):
        if method == "none":
            probabilities = raw
        elif method == calibration.method:
            probabilities = calibrated
        else:
            fitted = fit_calibration(held_out.logits, held_out.labels, method)
            probabilities = fitted.probabilities(z)
        methods[method] = CalibrationScore.model_validate(
            probability_metrics(y, probabilities).model_dump()
        )
    uncalibrated = quality_metrics(y, raw)
    return ModelComparison(
        model=uncalibrated if calibrated is raw else quality_metrics(y, calibrated),
        model_uncalibrated=uncalibrated,
        baseline=baseline,
        calibration_methods=methods,
    )


def assess(
    model: FittedModel,
    trained_on: SnapshotStream,
    judged_on: SnapshotStream,
    judged_splits: Iterable[str],
    method: CalibrationMethod,
) -> tuple[Calibration, ModelComparison]:
    """Calibrate ``model`` on ``trained_on``'s val split (a map that pays there, else none),
    fit the baseline on its train split,
    and compare both on ``judged_splits`` of ``judged_on``."""
    if judged_on.features != trained_on.features:
        raise ValueError("the judged rows must have the features the model was trained on")
    held_out = scored_rows(model, trained_on, ["val"])
    calibration = calibration_that_pays(held_out.logits, held_out.labels, method)
    judged = scored_rows(model, judged_on, judged_splits)
    baseline = baseline_figures(trained_on, judged_on, judged_splits, judged)
    return calibration, compare_on(judged, calibration, held_out, baseline)


def baseline_figures(
    trained_on: SnapshotStream,
    judged_on: SnapshotStream,
    judged_splits: Iterable[str],
    judged: ScoredRows,
) -> QualityMetrics:
    """The baseline fitted on ``trained_on`` judged on ``judged`` (``judged_splits`` of
    ``judged_on``): the same rows and the same baseline for every contender of a run, so
    computed once per process (:func:`tasks.ml.snapshot_reader.memoised`)."""
    key = (trained_on.content_key(), judged_on.content_key(), tuple(judged_splits))

    def figures() -> QualityMetrics:
        probabilities = baseline_of(trained_on).predict_proba(judged.baseline_x)
        return quality_metrics(judged.labels, probabilities)

    return memoised("baseline figures", key, figures).model_copy(deep=True)


def baseline_of(data: SnapshotStream) -> LogisticBaseline:
    """The RFM baseline fitted on ``data``'s train split: the same for every contender of a
    run, so fitted once per process (:func:`tasks.ml.snapshot_reader.memoised`)."""

    def fit() -> LogisticBaseline:
        # read as the baseline's four columns alone (the rfm family's view of the same rows):
        # decoding every feature of the T-2H train split for four of them was 150 MB and 1 s
        train = scored_rows(None, data.with_features(list(BASELINE_FEATURES)), ["train"])
        return fit_baseline(train.baseline_x, train.labels)

    return memoised("baseline", data.content_key(), fit)


def train_backtest_model(
    earlier: SnapshotStream,
    normalizer: Normalizer,
    spec: FamilySpec,
    settings: TrainingSettings,
    device: Device,
    production_rows: int | None = None,
) -> FittedModel:
    """A fresh model of ``spec``'s family fitted the way the run fits it (same settings and
    seed; no warm start: a production model may have seen the judged window) on the ``earlier``
    snapshot (features at T-2H, labels in (T-2H, T-H]): :func:`backtest_fit_job`."""
    job = backtest_fit_job(earlier, normalizer, settings, device, production_rows)
    return get_family(spec.kind).fit(spec, job).model


def backtest_fit_job(
    earlier: SnapshotStream,
    normalizer: Normalizer,
    settings: TrainingSettings,
    device: Device,
    production_rows: int | None = None,
) -> FitJob:
    """The backtest's fit: on :func:`backtest_sample` of ``earlier``'s training rows, with the
    network plan and epoch budget of :func:`backtest_fit_plan`."""
    rows = earlier.rows("train")
    data = backtest_sample(earlier, settings.backtest_max_rows)
    plan = backtest_fit_plan(
        settings,
        earlier_rows=rows,
        sample_rows=data.rows("train"),
        production_rows=production_rows,
    )
    if plan.plan_rows is not None:
        log.info(
            "backtest: the fit on %d rows is planned for %d rows (%s; a network runs at most "
            "%d epochs)",
            data.rows("train"),
            plan.plan_rows,
            "the production fit's" if production_rows else "the unsampled T-2H rows",
            plan.max_epochs,
        )
    return FitJob(
        data=data,
        normalizer=normalizer,
        settings=settings
        if plan.max_epochs == settings.max_epochs
        else settings.model_copy(update={"max_epochs": plan.max_epochs}),
        device=device,
        plan_rows=plan.plan_rows,
    )


@dataclass(frozen=True)
class BacktestFitPlan:
    """What the backtest's fit is sized by: the training rows its plan is for (a network's
    batch, learning rate and threads, the gbm's trees; None: its data's own), and a network's
    most epochs."""

    plan_rows: int | None
    max_epochs: int


def backtest_fit_plan(
    settings: TrainingSettings,
    *,
    earlier_rows: int,
    sample_rows: int,
    production_rows: int | None,
) -> BacktestFitPlan:
    """The backtest's fit is planned (a network's batch, learning rate, warm-up and threads,
    the gbm's leaves and learning rate) like the production fit on ``production_rows`` training
    rows, so a network's steps cost what the production fit's cost and use the same cores
    (planned for its own sample of ``sample_rows`` it got a smaller batch on one thread and
    stepped more epochs than the production fit) and the gbm grows the same trees. Sampled
    (``sample_rows < earlier_rows``), its epochs are capped by :func:`backtest_epochs`. Without
    ``production_rows`` a sampled fit is planned for the ``earlier_rows`` it stands for, an
    unsampled one for its own rows. Every figure is a row count: nothing the production fit
    learnt from its labels reaches the backtest."""
    sampled = sample_rows < earlier_rows
    if not sampled:
        return BacktestFitPlan(plan_rows=production_rows, max_epochs=settings.max_epochs)
    return BacktestFitPlan(
        plan_rows=production_rows or earlier_rows,
        max_epochs=backtest_epochs(settings, sample_rows, production_rows or earlier_rows),
    )


def min_epochs(settings: TrainingSettings) -> int:
    """The fewest epochs a network fit runs: early stopping waits ``patience`` epochs without
    improvement after the first."""
    return min(settings.max_epochs, settings.patience + 1)


def backtest_epochs(settings: TrainingSettings, sample_rows: int, production_rows: int) -> int:
    """The most epochs the backtest's network fit on ``sample_rows`` rows may run: as many as
    pass the examples the production fit on ``production_rows`` rows passes at the least
    (:func:`min_epochs` of them), at least one and at most ``max_epochs``."""
    budget = min_epochs(settings) * production_rows
    return max(1, min(settings.max_epochs, budget // max(1, sample_rows)))


def backtest_sample(earlier: SnapshotStream, max_rows: int) -> SnapshotStream:
    """The backtest's fitting data: ``earlier`` with its train split cut to a label-free
    sample of about ``max_rows`` rows (customers chosen by a hash of their id) when it holds
    more (0: all). Only what the T-2H snapshot holds decides it, so the verdict stays out of
    time; a sample can only make the backtest model weaker than the production fit, never
    better informed. Its val split (early stopping, calibration) and the baseline's train rows
    stay whole."""
    rows = earlier.rows("train")
    if not max_rows or rows <= max_rows:
        return earlier
    sample = earlier.train_sample(max_rows / rows)
    log.info(
        "backtest: fitting on a sample of %d of %d training rows at T-2H (HYBRIDFLOW_TRAIN__"
        "BACKTEST_MAX_ROWS=%d)",
        sample.rows("train"),
        rows,
        max_rows,
    )
    return sample


def backtest_comparison(
    earlier: SnapshotStream,
    normalizer: Normalizer,
    judged_on: SnapshotStream,
    spec: FamilySpec,
    settings: TrainingSettings,
    device: Device,
    method: CalibrationMethod,
    production_rows: int | None = None,
) -> tuple[Calibration, ModelComparison]:
    """Fit at T-2H (:func:`train_backtest_model`), then judge it and the baseline on every
    split of ``judged_on`` (the run's examples at T-H with their outcomes in (T-H, T]);
    ``production_rows``: the training rows of the production fit it must not outspend."""
    log.info(
        "backtest of %s: fitting at T-2H on %d customers, judging on %d customers at T-H",
        spec.kind,
        earlier.rows("train"),
        sum(judged_on.rows(s) for s in SPLITS),
    )
    model = train_backtest_model(earlier, normalizer, spec, settings, device, production_rows)
    return assess(model, earlier, judged_on, SPLITS, method)
