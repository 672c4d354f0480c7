"""The drift check: the scoring features at T (and their predictions) against the training data
of the model that scores them.

What a comparison needs from the training side is recorded once per model version, when it
becomes production (:func:`ensure_reference`): each feature's quantile bin edges and bin counts
over the version's training snapshot, the customers it was trained on, and the bin counts of its
scores on its own test split. Later checks read that reference and aggregate only the new data:
PSI per feature, the share of customers unseen in training, PSI of the score distribution.

The data is customer-sized. Datasets up to ``DriftSettings.in_process_rows`` rows (unset: the
stages' ``in_process_rows``) are read with pyarrow and aggregated with numpy in this process
(exact quantiles, the same binning rule), which takes milliseconds where each Spark job costs a
fraction of a second; larger ones are aggregated by Spark (``percentile_approx``, group-by bin
counts, an anti-join), started only then.
"""

from __future__ import annotations

import datetime as dt
import logging
import time

from infra.compute.spark import SessionProvider
from infra.errors import HybridflowInputError, StoreError
from infra.layout import (
    drift_customers_prefix,
    drift_reference_key,
    predictions_prefix,
    snapshot_prefix,
)
from infra.settings import DriftSettings, in_process_rows_or_default
from infra.storage.datasets import find_dataset, read_dataset_manifest
from infra.storage.registry import ModelRegistry
from infra.storage.snapshots import scoring_features_for
from infra.storage.store import ObjectStore
from tasks.data.drift_records import BinnedReference, DriftReference, DriftReport, DriftRow
from tasks.data.engine_choice import EngineChoice, EngineInputs, choose_engine
from tasks.data.stability import psi, sample_bin_counts, score_band_edges
from tasks.engines import registry as engines
from tasks.engines.drift_aggregator import SCORE, DriftAggregator
from tasks.ml.scoring_model import load_scoring_model, resolve_model_version

log = logging.getLogger(__name__)
UNSEEN = "unseen_customers"


def load_reference(store: ObjectStore, version: str) -> DriftReference | None:
    """The drift reference recorded for ``version``, None when there is none yet."""
    try:
        return DriftReference.model_validate_json(store.get_bytes(drift_reference_key(version)))
    except FileNotFoundError:
        return None


def ensure_reference(
    spark: SessionProvider, store: ObjectStore, version: str, settings: DriftSettings
) -> DriftReference:
    """The version's drift reference, built from its training snapshot the first time."""
    return load_reference(store, version) or build_reference(spark, store, version, settings)


def build_reference(
    spark: SessionProvider, store: ObjectStore, version: str, settings: DriftSettings
) -> DriftReference:
    """Record what drift checks of ``version`` compare with: per feature the quantile edges and
    bin counts over its training snapshot (every split), its customers, and the bin counts of
    its scores on the snapshot's test split (in score bands: :func:`score_band_edges`)."""
    started = time.perf_counter()
    manifest = ModelRegistry(store).get(version)
    if manifest.as_of is None or manifest.horizon_days is None:
        raise StoreError(f"model {version} records no as_of/horizon: its snapshot is unknown")
    prefix = manifest.snapshot or snapshot_prefix(manifest.as_of, manifest.horizon_days)
    published = find_dataset(store, prefix)
    if published is None or published.created_at > manifest.created_at:
        raise StoreError(
            f"the training snapshot of model {version} ({store.key_uri(prefix)}) is gone or was "
            "replaced after the model was trained: its drift reference cannot be built"
        )
    model = load_scoring_model(store, version)
    target = drift_customers_prefix(version)
    choice = drift_engine(settings, published.rows)
    aggregates = engines.drift_aggregator(choice.engine, spark).snapshot(
        store, published, model, target, settings
    )
    scores = aggregates.scores
    score_edges = score_band_edges(scores, settings.bins, settings.score_resolution)
    reference = DriftReference(
        model_version=version,
        snapshot_prefix=prefix,
        snapshot_data_prefix=published.data_prefix,
        training_as_of=manifest.as_of,
        horizon_days=manifest.horizon_days,
        rows=published.rows,
        customers_prefix=aggregates.customers.prefix,
        features={
            f: BinnedReference(edges=e, counts=aggregates.counts[f])
            for f, e in aggregates.edges.items()
        },
        score=BinnedReference(edges=score_edges, counts=sample_bin_counts(scores, score_edges)),
    )
    store.put_bytes(drift_reference_key(version), reference.model_dump_json(indent=2).encode())
    log.info(
        "drift reference of %s recorded from %s (%d rows) in %.1fs",
        version,
        store.key_uri(prefix),
        published.rows,
        time.perf_counter() - started,
    )
    return reference


def measure_drift(
    spark: SessionProvider,
    store: ObjectStore,
    run_id: str,
    as_of: dt.date,
    settings: DriftSettings,
    model_version: str | None = None,
    features_prefix: str | None = None,
) -> DriftReport:
    """The drift table of the scoring features at ``as_of`` (a run's at ``features_prefix``;
    default: the most recently published of that date) (and of their predictions, when
    ``model_version`` scored them) against ``model_version`` (default: production)."""
    started = time.perf_counter()
    version = resolve_model_version(ModelRegistry(store), model_version)
    published = scoring_features_for(store, as_of, features_prefix)
    if published is None:
        raise HybridflowInputError(
            f"no features published for as_of {as_of}: run the features stage for that date first"
        )
    reference = ensure_reference(spark, store, version, settings)
    edges = {f: ref.edges for f, ref in reference.features.items()}
    known = read_dataset_manifest(store, reference.customers_prefix)
    choice = drift_engine(settings, published.rows, known.rows)
    log.info("drift: %s (%s)", choice.engine, choice.reason)
    aggregator = engines.drift_aggregator(choice.engine, spark)
    counts, unseen_customers = aggregator.features(store, published, known, edges)
    rows = [
        DriftRow.measured(
            f,
            "psi",
            psi(reference.features[f].counts, counts[f], settings.min_share)
            if counts.get(f)
            else None,
            settings.psi_threshold,
            ignored=f in settings.ignore_features,
        )
        for f in reference.features
    ]
    rows_scored = sum(next(iter(counts.values()), {}).values())
    unseen = unseen_customers / rows_scored if rows_scored else None
    rows.append(DriftRow.measured(UNSEEN, "unseen_share", unseen, settings.unseen_share_threshold))
    rows.append(_score_row(aggregator, store, as_of, version, reference, settings))
    report = DriftReport(
        run_id=run_id,
        as_of=as_of,
        model_version=version,
        reference_as_of=reference.training_as_of,
        reference_horizon_days=reference.horizon_days,
        rows_compared=rows_scored,
        rows=rows,
        seconds=time.perf_counter() - started,
        engine=choice.engine,
        engine_reason=choice.reason,
    )
    log.info(
        "drift at %s against %s: %s (%s)",
        as_of,
        version,
        report.status,
        ", ".join(f"{r.feature} {r.value:.3f}" for r in report.drifted)
        or "nothing above threshold",
    )
    return report


def _score_row(
    aggregator: DriftAggregator,
    store: ObjectStore,
    as_of: dt.date,
    version: str,
    reference: DriftReference,
    settings: DriftSettings,
) -> DriftRow:
    """PSI of the predictions at ``as_of`` against the reference's scores (by the check's
    engine: the predictions are one row per scored customer); ``n/a`` when no predictions of
    ``version`` were published for that date."""
    published = find_dataset(store, predictions_prefix(as_of))
    if reference.score is None or published is None:
        return DriftRow.measured(SCORE, "psi", None, settings.score_psi_threshold)
    if published.metadata.get("model_version") != version:
        log.info("predictions at %s were made by another model: score drift not measured", as_of)
        return DriftRow.measured(SCORE, "psi", None, settings.score_psi_threshold)
    counts = aggregator.scores(store, published, reference.score.edges)
    value = psi(reference.score.counts, counts, settings.min_share) if counts else None
    return DriftRow.measured(SCORE, "psi", value, settings.score_psi_threshold)


def drift_status_line(report: DriftReport) -> str:
    """One line saying what drifted, for logs and events."""
    if not report.drifted:
        return f"no drift at {report.as_of} against {report.model_version}"
    parts = ", ".join(f"{r.feature} {r.measure} {r.value:.3f}" for r in report.drifted)
    return f"drift at {report.as_of} against {report.model_version}: {parts}"


def drift_engine(settings: DriftSettings, *rows: int) -> EngineChoice:
    """The engine that aggregates datasets of ``rows`` rows (the one choice,
    :mod:`tasks.data.engine_choice`; the limit: ``in_process_rows``, unset: the stages')."""
    limit = in_process_rows_or_default(settings.in_process_rows)
    return choose_engine("drift", EngineInputs(rows=max(rows), limit=limit))
