"""Scoring a Spark DataFrame of features in place (the drift check scores a snapshot's test split
this way to bin its scores); the batch-inference stage scores whole files instead."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import DateType, DoubleType, StringType, StructField, StructType

from tasks.ml.scoring_worker import (
    PREDICTION_COLUMNS,
    ScoringModel,
    feature_matrix,
    prediction_batch,
    worker_model,
)

PREDICTION_SCHEMA = StructType(
    [
        StructField(name, dtype, False)
        for name, dtype in zip(
            PREDICTION_COLUMNS, (StringType(), DoubleType(), StringType(), DateType()), strict=True
        )
    ]
)


def score_features(
    features: DataFrame, model: ScoringModel, as_of: dt.date, *, torch_threads: int = 1
) -> DataFrame:
    """Predictions per the contract for every row of ``features`` (customer_id + raw features);
    the model travels inside the task as bytes and loads once per Python worker."""
    missing = [f for f in model.features if f not in features.columns]
    if "customer_id" not in features.columns:
        missing.insert(0, "customer_id")
    if missing:
        raise ValueError(f"features for scoring lack column(s) the model needs: {missing}")
    feature_order = list(model.features)
    version = model.version

    def score_batches(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import torch

        from tasks.ml.model import predict_proba

        torch.set_num_threads(torch_threads)
        loaded, _ = worker_model(model)
        for batch in batches:
            scores = predict_proba(loaded, feature_matrix(batch, feature_order))
            yield prediction_batch(batch.column("customer_id"), scores, version, as_of)

    selected = features.select(
        F.col("customer_id").cast("string"), *[F.col(f).cast("double") for f in feature_order]
    )
    return selected.mapInArrow(score_batches, schema=PREDICTION_SCHEMA)
