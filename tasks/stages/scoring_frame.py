"""Scoring a small Spark DataFrame or Arrow table of features in this process: the drift
reference scores its snapshot's test split this way (one collect, or none when the snapshot was
read with pyarrow; no Python worker to start, no second pass to bin the scores); the
batch-inference stage scores whole files on the executors instead."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from tasks.ml.models import predict_proba
from tasks.ml.scoring_worker import ScoringModel, feature_matrix, worker_model


def scores_in_process(features: DataFrame, model: ScoringModel) -> np.ndarray:
    """The model's calibrated score for every row of ``features`` (raw feature columns)."""
    _check_columns(features.columns, model)
    order = list(model.features)
    return scores_of_table(
        features.select(*[F.col(f).cast("double") for f in order]).toArrow(), model
    )


def scores_of_table(table: pa.Table, model: ScoringModel) -> np.ndarray:
    """The model's calibrated score for every row of an Arrow table of features."""
    _check_columns(table.column_names, model)
    if table.num_rows == 0:
        return np.empty(0, dtype=np.float64)
    order = list(model.features)
    as_double = pa.schema([pa.field(f, pa.float64()) for f in order])
    columns = table.select(order).cast(as_double).combine_chunks().to_batches()[0]
    loaded, _ = worker_model(model)
    return predict_proba(loaded, feature_matrix(columns, order))


def _check_columns(columns: list[str], model: ScoringModel) -> None:
    missing = [f for f in model.features if f not in columns]
    if missing:
        raise ValueError(f"features for scoring lack column(s) the model needs: {missing}")
