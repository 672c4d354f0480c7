"""The batch-inference stage: score every customer's features at T with a registry version."""

from __future__ import annotations

import datetime as dt
import time

from pyspark.sql import SparkSession

from infra.datasets import find_dataset
from infra.errors import HybridflowInputError
from infra.registry import ModelRegistry
from infra.store import ObjectStore
from tasks.build_features import scoring_features_prefix
from tasks.inference import score_features
from tasks.spark_io import read_dataset, write_dataset
from tasks.stage_records import InferenceResult, StageReport


def predictions_prefix(as_of: dt.date) -> str:
    """Where predictions for an as-of date are published (re-scoring replaces them)."""
    return f"predictions/as_of={as_of.isoformat()}"


def resolve_model_version(registry: ModelRegistry, model_version: str | None) -> str:
    """The requested version, or the one ``production`` points at."""
    if model_version:
        return model_version
    production = registry.alias()
    if production is None:
        raise HybridflowInputError("no production model yet: train one first (hybridflow run)")
    return production.version


def batch_inference_stage(
    spark: SparkSession,
    store: ObjectStore,
    as_of: dt.date,
    model_version: str | None = None,
) -> InferenceResult:
    """Score the published features for ``as_of`` and publish predictions atomically."""
    started = time.perf_counter()
    registry = ModelRegistry(store)
    version = resolve_model_version(registry, model_version)
    manifest, files = registry.read_files(version)
    prefix = scoring_features_prefix(as_of)
    if find_dataset(store, prefix) is None:
        raise HybridflowInputError(
            f"no features published for as_of {as_of}: run the features stage for that date first"
        )
    features = read_dataset(spark, store, prefix)
    scored = score_features(features, files, manifest.files, manifest.features, version, as_of)
    out = write_dataset(
        scored, store, predictions_prefix(as_of), metadata={"model_version": version}
    )
    return InferenceResult(
        report=StageReport(
            name="batch_inference",
            seconds=time.perf_counter() - started,
            rows_in=out.rows,
            rows_out=out.rows,
        ),
        model_version=version,
        predictions_prefix=out.prefix,
        predictions_uri=store.key_uri(out.data_prefix),
        rows_scored=out.rows,
    )
