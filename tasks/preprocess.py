"""Preprocessing in Spark: deterministic customer split and a normaliser fitted on train only.

The normaliser maps each feature ``x`` to ``(signed_log1p(x) - mean) / std`` with mean/std from
the train split; the model applies it itself (so batch scoring and serving take raw features).
"""

from __future__ import annotations

import datetime as dt
import json
import math
import time

from pydantic import BaseModel
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from infra.datasets import read_dataset_manifest
from infra.errors import HybridflowInputError
from infra.store import ObjectStore, sha256_bytes
from tasks.fingerprint import code_version, stage_fingerprint
from tasks.spark_io import read_dataset, write_dataset
from tasks.stage_cache import load_cached, save_cached
from tasks.stage_records import FeaturesResult, PreprocessResult, StageReport

SPLITS = ("train", "val", "test")
PREPROCESS_CODE = ("tasks.preprocess", "tasks.spark_io", "infra.datasets")


class SplitFractions(BaseModel):
    """Share of customers per split; the rest goes to test."""

    train: float = 0.70
    val: float = 0.15


class Normalizer(BaseModel):
    """Per-feature mean/std of ``signed_log1p(x)`` on the train split."""

    features: list[str]
    mean: list[float]
    std: list[float]


def signed_log1p(col: Column) -> Column:
    """``sign(x) * log1p(|x|)``: tames heavy tails (amounts, counts) and keeps the sign."""
    return F.signum(col) * F.log1p(F.abs(col))


def assign_split(df: DataFrame, seed: int, fractions: SplitFractions | None = None) -> DataFrame:
    """Add ``split`` from a hash of ``customer_id`` and ``seed``: same customer, same split."""
    fractions = fractions or SplitFractions()
    bucket = F.pmod(F.xxhash64(F.col("customer_id"), F.lit(seed)), F.lit(10_000)) / 10_000.0
    split = (
        F.when(bucket < fractions.train, "train")
        .when(bucket < fractions.train + fractions.val, "val")
        .otherwise("test")
    )
    return df.withColumn("split", split)


def fit_normalizer(train: DataFrame, features: list[str]) -> Normalizer:
    """Mean and std of ``signed_log1p`` of each feature over ``train`` (one small aggregate)."""
    aggs = []
    for f in features:
        x = signed_log1p(F.col(f))
        aggs += [F.avg(x).alias(f"m_{f}"), F.stddev_pop(x).alias(f"s_{f}")]
    row = train.agg(*aggs).first()
    if row is None:
        raise ValueError("cannot fit a normaliser on an empty train split")
    mean = [float(row[f"m_{f}"] or 0.0) for f in features]
    std = []
    for f in features:
        s = row[f"s_{f}"]
        std.append(float(s) if s is not None and math.isfinite(s) and s > 1e-9 else 1.0)
    return Normalizer(features=features, mean=mean, std=std)


def snapshot_prefix(as_of: dt.date, horizon_days: int) -> str:
    """Where the training snapshot for an as-of and horizon is published."""
    return f"snapshots/as_of={as_of.isoformat()}_h{horizon_days}"


def preprocess_stage(
    spark: SparkSession,
    store: ObjectStore,
    features: FeaturesResult,
    seed: int,
    *,
    use_cache: bool = True,
    run_id: str = "",
) -> PreprocessResult:
    """Split customers, fit the normaliser on train, publish the snapshot (split=train|val|test).

    The same training examples (data generation), seed and code reuse an earlier output."""
    fingerprint = stage_fingerprint(
        "preprocess",
        examples=read_dataset_manifest(store, features.training_prefix).data_prefix,
        features=features.features,
        as_of=features.as_of.isoformat(),
        horizon_days=features.horizon_days,
        seed=seed,
        fractions=SplitFractions().model_dump(),
        code=code_version(*PREPROCESS_CODE),
    )
    result = load_cached(store, "preprocess", fingerprint, PreprocessResult) if use_cache else None
    if result is None:
        result = build_snapshot(spark, store, features, seed)
        save_cached(store, "preprocess", fingerprint, run_id, result, [result.snapshot_prefix])
    return result


def build_snapshot(
    spark: SparkSession, store: ObjectStore, features: FeaturesResult, seed: int
) -> PreprocessResult:
    """Split, fit and publish the snapshot for ``features`` (no cache)."""
    started = time.perf_counter()
    examples = assign_split(read_dataset(spark, store, features.training_prefix), seed)
    normalizer = fit_normalizer(examples.filter(F.col("split") == "train"), features.features)
    snapshot = write_dataset(
        examples.select("customer_id", "label", *features.features, "split"),
        store,
        snapshot_prefix(features.as_of, features.horizon_days),
        partition_by=["split"],
        metadata={"normalizer": normalizer.model_dump(), "features": features.features},
    )
    written = read_dataset(spark, store, snapshot.prefix)
    counts = {r["split"]: int(r["count"]) for r in written.groupBy("split").count().collect()}
    for split in SPLITS:
        if counts.get(split, 0) == 0:
            raise HybridflowInputError(
                f"split {split!r} is empty ({features.n_training} training customers): "
                "use more data or an earlier as_of"
            )
    fingerprint = sha256_bytes(
        json.dumps({"files": snapshot.files, "rows": snapshot.rows, "counts": counts}).encode()
    )
    return PreprocessResult(
        report=StageReport(
            name="preprocess",
            seconds=time.perf_counter() - started,
            rows_in=features.n_training,
            rows_out=snapshot.rows,
        ),
        snapshot_prefix=snapshot.prefix,
        split_counts=counts,
        features=features.features,
        data_fingerprint=fingerprint,
    )
