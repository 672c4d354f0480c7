"""The drift check: the scoring features at T (and their predictions) against the training data
of the model that scores them.

What a comparison needs from the training side is recorded once per model version, when it
becomes production (:func:`ensure_reference`): each feature's quantile bin edges and bin counts
over the version's training snapshot, the customers it was trained on, and the bin counts of its
scores on its own test split. Later checks read that reference and aggregate only the new data:
PSI per feature, the share of customers unseen in training, PSI of the score distribution.
"""

from __future__ import annotations

import datetime as dt
import logging
import time

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from infra.datasets import find_dataset
from infra.errors import HybridflowInputError, StoreError
from infra.layout import (
    drift_customers_prefix,
    drift_reference_key,
    predictions_prefix,
    scoring_features_prefix,
    snapshot_prefix,
)
from infra.registry import ModelRegistry
from infra.settings import DriftSettings
from infra.store import ObjectStore
from tasks.data.drift import bin_counts, quantile_edges, unseen_count
from tasks.data.stability import exact_quantile_edges, psi, sample_bin_counts
from tasks.stages.batch_inference import load_scoring_model, resolve_model_version
from tasks.stages.drift_records import BinnedReference, DriftReference, DriftReport, DriftRow
from tasks.stages.scoring_frame import scores_in_process
from tasks.stages.spark_io import read_dataset, write_dataset

log = logging.getLogger(__name__)
SCORE = "score"
UNSEEN = "unseen_customers"


def load_reference(store: ObjectStore, version: str) -> DriftReference | None:
    """The drift reference recorded for ``version``, None when there is none yet."""
    try:
        return DriftReference.model_validate_json(store.get_bytes(drift_reference_key(version)))
    except FileNotFoundError:
        return None


def ensure_reference(
    spark: SparkSession, store: ObjectStore, version: str, settings: DriftSettings
) -> DriftReference:
    """The version's drift reference, built from its training snapshot the first time."""
    return load_reference(store, version) or build_reference(spark, store, version, settings)


def build_reference(
    spark: SparkSession, store: ObjectStore, version: str, settings: DriftSettings
) -> DriftReference:
    """Record what drift checks of ``version`` compare with: per feature the quantile edges and
    bin counts over its training snapshot (every split), its customers, and the bin counts of
    its scores on the snapshot's test split."""
    started = time.perf_counter()
    manifest = ModelRegistry(store).get(version)
    if manifest.as_of is None or manifest.horizon_days is None:
        raise StoreError(f"model {version} records no as_of/horizon: its snapshot is unknown")
    prefix = snapshot_prefix(manifest.as_of, manifest.horizon_days)
    published = find_dataset(store, prefix)
    if published is None or published.created_at > manifest.created_at:
        raise StoreError(
            f"the training snapshot of model {version} ({store.key_uri(prefix)}) is gone or was "
            "replaced after the model was trained: its drift reference cannot be built"
        )
    snapshot = read_dataset(spark, store, prefix)
    edges = quantile_edges(snapshot, manifest.features, settings.bins, settings.quantile_accuracy)
    counts = bin_counts(snapshot, edges)
    customers = write_dataset(
        snapshot.select("customer_id").distinct(), store, drift_customers_prefix(version)
    )
    scores = scores_in_process(
        snapshot.filter(F.col("split") == "test"), load_scoring_model(store, version)
    )
    score_edges = exact_quantile_edges(scores, settings.bins)
    reference = DriftReference(
        model_version=version,
        snapshot_prefix=prefix,
        snapshot_data_prefix=published.data_prefix,
        training_as_of=manifest.as_of,
        horizon_days=manifest.horizon_days,
        rows=published.rows,
        customers_prefix=customers.prefix,
        features={f: BinnedReference(edges=edges[f], counts=counts[f]) for f in edges},
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
    spark: SparkSession,
    store: ObjectStore,
    run_id: str,
    as_of: dt.date,
    settings: DriftSettings,
    model_version: str | None = None,
) -> DriftReport:
    """The drift table of the scoring features at ``as_of`` (and of their predictions, when
    ``model_version`` scored them) against ``model_version`` (default: production)."""
    started = time.perf_counter()
    version = resolve_model_version(ModelRegistry(store), model_version)
    features_prefix = scoring_features_prefix(as_of)
    if find_dataset(store, features_prefix) is None:
        raise HybridflowInputError(
            f"no features published for as_of {as_of}: run the features stage for that date first"
        )
    reference = ensure_reference(spark, store, version, settings)
    features = read_dataset(spark, store, features_prefix)
    edges = {f: ref.edges for f, ref in reference.features.items() if f in features.columns}
    counts = bin_counts(features, edges)
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
    known = read_dataset(spark, store, reference.customers_prefix)
    unseen = unseen_count(features, known) / rows_scored if rows_scored else None
    rows.append(DriftRow.measured(UNSEEN, "unseen_share", unseen, settings.unseen_share_threshold))
    rows.append(_score_row(spark, store, as_of, version, reference, settings))
    report = DriftReport(
        run_id=run_id,
        as_of=as_of,
        model_version=version,
        reference_as_of=reference.training_as_of,
        reference_horizon_days=reference.horizon_days,
        rows_compared=rows_scored,
        rows=rows,
        seconds=time.perf_counter() - started,
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
    spark: SparkSession,
    store: ObjectStore,
    as_of: dt.date,
    version: str,
    reference: DriftReference,
    settings: DriftSettings,
) -> DriftRow:
    """PSI of the predictions at ``as_of`` against the reference's scores; ``n/a`` when no
    predictions of ``version`` were published for that date."""
    published = find_dataset(store, predictions_prefix(as_of))
    if reference.score is None or published is None:
        return DriftRow.measured(SCORE, "psi", None, settings.score_psi_threshold)
    if published.metadata.get("model_version") != version:
        log.info("predictions at %s were made by another model: score drift not measured", as_of)
        return DriftRow.measured(SCORE, "psi", None, settings.score_psi_threshold)
    predictions = read_dataset(spark, store, predictions_prefix(as_of))
    counts = bin_counts(predictions, {SCORE: reference.score.edges})[SCORE]
    value = psi(reference.score.counts, counts, settings.min_share) if counts else None
    return DriftRow.measured(SCORE, "psi", value, settings.score_psi_threshold)


def drift_status_line(report: DriftReport) -> str:
    """One line saying what drifted, for logs and events."""
    if not report.drifted:
        return f"no drift at {report.as_of} against {report.model_version}"
    parts = ", ".join(f"{r.feature} {r.measure} {r.value:.3f}" for r in report.drifted)
    return f"drift at {report.as_of} against {report.model_version}: {parts}"
