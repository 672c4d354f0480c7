"""Scoring a small Spark DataFrame of features in this process: the drift reference scores its
snapshot's test split this way (one collect, no Python worker to start, no second pass to bin
the scores); the batch-inference stage scores whole files on the executors instead."""

from __future__ import annotations

import numpy as np
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from tasks.ml.model import predict_proba
from tasks.ml.scoring_worker import ScoringModel, feature_matrix, worker_model


def scores_in_process(features: DataFrame, model: ScoringModel) -> np.ndarray:
    """The model's calibrated score for every row of ``features`` (raw feature columns)."""
    missing = [f for f in model.features if f not in features.columns]
    if missing:
        raise ValueError(f"features for scoring lack column(s) the model needs: {missing}")
    order = list(model.features)
    table = features.select(*[F.col(f).cast("double") for f in order]).toArrow()
    if table.num_rows == 0:
        return np.empty(0, dtype=np.float64)
    loaded, _ = worker_model(model)
    return predict_proba(loaded, feature_matrix(table.combine_chunks().to_batches()[0], order))
