"""The feature transform every family starts from: ``signed_log1p``, then standardised with the
train split's mean and std (published with the snapshot by :mod:`tasks.data.split`)."""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel


class Normalizer(BaseModel):
    """Per-feature mean/std of ``signed_log1p(x)`` on the train split."""

    features: list[str]
    mean: list[float]
    std: list[float]

    def transform(self, x: np.ndarray) -> np.ndarray:
        """``(signed_log1p(x) - mean) / std`` in float64 (a zero std counts as 1)."""
        std = np.asarray(self.std, dtype=np.float64)
        std = np.where(std > 1e-12, std, 1.0)
        out = signed_log1p(x)  # a new array: the same two operations, without two more
        out -= np.asarray(self.mean, dtype=np.float64)
        out /= std
        return out


def signed_log1p(x: np.ndarray) -> np.ndarray:
    """``sign(x) * log1p(|x|)`` in float64, value for value (``-0.0`` gives ``0.0``, NaN stays
    NaN), in one new array: every contender's fit and scoring pass calls it on every chunk."""
    out = np.abs(x, dtype=np.float64)
    np.log1p(out, out=out)
    np.copysign(out, x, out=out)
    out += 0.0  # -0.0 -> 0.0, as sign(-0.0) * log1p(0.0) gives
    return out
