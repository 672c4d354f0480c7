"""The preprocess stage: split the training examples by customer (the same split at every origin,
so no customer is in two splits), fit the normaliser on the train split, and publish the
snapshot the GPU stage trains on (``split=train|val|test``, each example with its ``origin``);
the same for the backtest's examples (origins from T-2H down) when the features stage
published them."""

from __future__ import annotations

import datetime as dt
import json
import logging
import time
from typing import Any

from pyspark.sql import SparkSession

from infra.compute.spark import SessionProvider
from infra.errors import HybridflowInputError
from infra.fingerprint import code_modules, code_version, stage_fingerprint
from infra.layout import backtest_snapshot_prefix, snapshot_prefix
from infra.settings import in_process_rows_or_default
from infra.storage.datasets import DatasetManifest, read_dataset_manifest
from infra.storage.stage_cache import load_cached, save_cached
from infra.storage.store import ObjectStore, sha256_bytes
from tasks.data.engine_choice import EngineInputs, choose_engine
from tasks.data.split import SPLITS, SplitFractions, non_finite_features, normalizer_from
from tasks.engines import registry as engines
from tasks.engines.snapshot_builder import SnapshotBuilder
from tasks.ml.normalizer import Normalizer
from tasks.reporting.records import FeaturesResult, PreprocessResult, StageReport

log = logging.getLogger(__name__)


def preprocess_stage(
    spark: SparkSession | SessionProvider,
    store: ObjectStore,
    features: FeaturesResult,
    seed: int,
    *,
    use_cache: bool = True,
    run_id: str = "",
    in_process_rows: int | None = None,
) -> PreprocessResult:
    """Split customers, fit the normaliser on train, publish the snapshot (split=train|val|test).

    The same training examples (data generation), seed and code reuse an earlier output."""
    fingerprint = stage_fingerprint(
        "preprocess",
        examples=read_dataset_manifest(store, features.training_prefix).data_prefix,
        backtest_examples=(
            read_dataset_manifest(store, features.backtest_prefix).data_prefix
            if features.backtest_prefix
            else features.backtest_skipped
        ),
        features=features.features,
        as_of=features.as_of.isoformat(),
        horizon_days=features.horizon_days,
        seed=seed,
        fractions=SplitFractions().model_dump(),
        code=code_version(*code_modules(__name__)),
    )
    result = load_cached(store, "preprocess", fingerprint, PreprocessResult) if use_cache else None
    if result is None:
        result = build_snapshot(
            spark, store, features, seed, in_process_rows=in_process_rows, run_id=run_id
        )
        outputs = [result.snapshot_prefix] + (
            [result.backtest_snapshot_prefix] if result.backtest_snapshot_prefix else []
        )
        save_cached(store, "preprocess", fingerprint, run_id, result, outputs)
    return result


def build_snapshot(
    spark: SparkSession | SessionProvider,
    store: ObjectStore,
    features: FeaturesResult,
    seed: int,
    *,
    in_process_rows: int | None = None,
    run_id: str = "",
) -> PreprocessResult:
    """Split, fit and publish the snapshot for ``features`` (no cache), and the backtest's, under
    run ``run_id`` (no other run replaces them; "": the run-less keys of earlier releases): one
    job each, which writes the snapshot and observes the split counts and the normaliser's
    statistics on the way; in this process instead for up to ``in_process_rows`` examples
    (default: the setting)."""
    started = time.perf_counter()
    limit = in_process_rows_or_default(in_process_rows)
    sources = [features.training_prefix] + (
        [features.backtest_prefix] if features.backtest_prefix else []
    )
    rows = max(read_dataset_manifest(store, prefix).rows for prefix in sources)
    choice = choose_engine("preprocess", EngineInputs(rows=rows, limit=limit))
    log.info("preprocess: %s (%s)", choice.engine, choice.reason)
    builder = engines.snapshot_builder(choice.engine, spark)
    snapshot, counts = publish_snapshot(
        builder,
        store,
        features.training_prefix,
        snapshot_prefix(features.as_of, features.horizon_days, run_id),
        features.features,
        seed,
        features.training_origins,
    )
    missing = [split for split in SPLITS if counts[split] == 0]
    if missing:
        raise HybridflowInputError(
            f"split {missing[0]!r} is empty ({features.n_training} training examples): "
            "use more data or an earlier as_of"
        )
    backtest_prefix, backtest_counts, skipped = None, {}, features.backtest_skipped
    if features.backtest_prefix:
        backtest, backtest_counts = publish_snapshot(
            builder,
            store,
            features.backtest_prefix,
            backtest_snapshot_prefix(features.as_of, features.horizon_days, run_id),
            features.features,
            seed,
            features.backtest_origins,
        )
        empty = [split for split in SPLITS if backtest_counts[split] == 0]
        if empty:
            skipped = (
                f"no backtest: its split {empty[0]!r} is empty ({features.n_backtest} examples)"
            )
        else:
            backtest_prefix = backtest.prefix
    fingerprint = sha256_bytes(
        json.dumps({"files": snapshot.files, "rows": snapshot.rows, "counts": counts}).encode()
    )
    return PreprocessResult(
        report=StageReport(
            name="preprocess",
            seconds=time.perf_counter() - started,
            rows_in=features.n_training,
            rows_out=snapshot.rows,
            spark_jobs=builder.spark_jobs,
        ).with_engine(choice),
        snapshot_prefix=snapshot.prefix,
        split_counts=counts,
        features=features.features,
        data_fingerprint=fingerprint,
        backtest_snapshot_prefix=backtest_prefix,
        backtest_split_counts=backtest_counts,
        backtest_skipped=skipped,
    )


def publish_snapshot(
    builder: SnapshotBuilder,
    store: ObjectStore,
    examples_prefix: str,
    out_prefix: str,
    features: list[str],
    seed: int,
    origins: list[dt.date],
) -> tuple[DatasetManifest, dict[str, int]]:
    """Split the examples at ``examples_prefix`` by customer (a customer is in the same split at
    every origin), fit the normaliser on the train split and publish them at ``out_prefix``
    (``origins``, newest first, recorded in its metadata) with ``builder``'s engine: the
    dataset and its rows per split. Non-finite feature values publish nothing."""

    def metadata(values: dict[str, Any]) -> dict[str, Any]:
        bad = non_finite_features(values, features)
        if bad:
            named = ", ".join(f"{f} ({n} value(s))" for f, n in bad.items())
            raise HybridflowInputError(
                f"non-finite feature values (NaN or infinite) in {store.key_uri(examples_prefix)}: "
                f"{named}; an event amount too large for the features' arithmetic? (lower "
                "HYBRIDFLOW_MAX_AMOUNT to quarantine such rows); no snapshot was published"
            )
        mean, std = normalizer_from(values, features)
        normalizer = Normalizer(features=features, mean=mean, std=std)
        return {
            "normalizer": normalizer.model_dump(),
            "features": features,
            "origins": [o.isoformat() for o in origins],
        }

    examples = read_dataset_manifest(store, examples_prefix)
    snapshot, values = builder.publish(store, examples, out_prefix, features, seed, metadata)
    return snapshot, {split: int(values[f"n_{split}"]) for split in SPLITS}
