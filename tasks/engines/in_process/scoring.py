"""Scoring a small Spark DataFrame or Arrow table of features in this process: the drift
reference scores its snapshot's test split this way (one collect, or none when the snapshot was
read with pyarrow; no Python worker to start, no second pass to bin the scores); the
batch-inference stage scores whole files on the executors instead."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from pyspark.sql import DataFrame

from tasks.ml.model_inputs import input_matrix, source_columns
from tasks.ml.models import predict_proba
from tasks.ml.scoring_worker import ScoringModel, worker_model


def scores_in_process(features: DataFrame, model: ScoringModel) -> np.ndarray:
    """The model's calibrated score for every row of ``features`` (raw feature columns, and the
    sequence columns a sequence model reads)."""
    _check_columns(features.columns, model)
    return scores_of_table(features.select(*source_columns(model.features)).toArrow(), model)


def scores_of_table(table: pa.Table, model: ScoringModel) -> np.ndarray:
    """The model's calibrated score for every row of an Arrow table of features."""
    _check_columns(table.column_names, model)
    if table.num_rows == 0:
        return np.empty(0, dtype=np.float64)
    loaded, _ = worker_model(model)
    return predict_proba(loaded, input_matrix(table, list(model.features)))


def _check_columns(columns: list[str], model: ScoringModel) -> None:
    missing = [f for f in source_columns(model.features) if f not in columns]
    if missing:
        raise ValueError(f"features for scoring lack column(s) the model needs: {missing}")
