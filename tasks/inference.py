"""Batch scoring in Spark: ``mapInPandas`` with the model loaded once per Python worker.

The model travels as its bundle bytes plus sha256s (small for this MLP); each worker verifies
and loads it once (cached by checksum) and scores Arrow batches with one torch thread, so that
Spark's task parallelism, not torch's, uses the cores.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator

import numpy as np
import pandas as pd
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import DateType, DoubleType, StringType, StructField, StructType

PREDICTION_SCHEMA = StructType(
    [
        StructField("customer_id", StringType(), False),
        StructField("score", DoubleType(), False),
        StructField("model_version", StringType(), False),
        StructField("as_of", DateType(), False),
    ]
)

_WORKER_MODELS: dict[str, object] = {}


def _worker_model(files: dict[str, bytes], sha256: dict[str, str]):
    from tasks.model import load_bundle

    key = "|".join(f"{k}:{v}" for k, v in sorted(sha256.items()))
    model = _WORKER_MODELS.get(key)
    if model is None:
        import torch

        torch.set_num_threads(1)
        model = load_bundle(files, sha256)
        _WORKER_MODELS.clear()
        _WORKER_MODELS[key] = model
    return model


def score_features(
    features: DataFrame,
    files: dict[str, bytes],
    sha256: dict[str, str],
    feature_order: list[str],
    model_version: str,
    as_of: dt.date,
) -> DataFrame:
    """Predictions per the contract for every row of ``features`` (customer_id + raw features)."""
    missing = [f for f in feature_order if f not in features.columns]
    if missing:
        raise ValueError(f"features for scoring lack column(s) the model needs: {missing}")

    def score_batches(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        from tasks.model import predict_proba

        model = _worker_model(files, sha256)
        for batch in batches:
            x = batch[feature_order].to_numpy(dtype=np.float32, na_value=0.0)
            yield pd.DataFrame(
                {
                    "customer_id": batch["customer_id"].astype(str),
                    "score": predict_proba(model, x),
                    "model_version": model_version,
                    "as_of": as_of,
                }
            )

    selected = features.select("customer_id", *[F.col(f).cast("double") for f in feature_order])
    return selected.mapInPandas(score_batches, schema=PREDICTION_SCHEMA)
