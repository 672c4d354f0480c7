"""When no family can produce a model, the train stage says why and what to do (exit 2)."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pytest

from infra.errors import HybridflowInputError
from tasks.stages.train import check_trainable


class _Splits:
    """Labels per split, counted as the snapshot stream counts them."""

    def __init__(self, **labels: list[int]) -> None:
        self.labels = {k: np.asarray(v, dtype=np.float32) for k, v in labels.items()}
        self.splits = dict.fromkeys(self.labels)

    def rows(self, split: str) -> int:
        return len(self.labels[split])

    def label_counts(self) -> dict[str, tuple[int, int]]:
        return {k: (len(y), int(y.sum())) for k, y in self.labels.items()}


AS_OF = dt.date(2025, 12, 31)


def test_one_class_names_the_window_and_the_fix():
    data = _Splits(train=[0] * 50, val=[0] * 10, test=[0] * 10)
    with pytest.raises(
        HybridflowInputError,
        match=r"all 70 training examples have one class: no customer bought in the label window \(2025-10-02, 2025-12-31\].*fix: ",
    ):
        check_trainable(data, AS_OF, 90)  # type: ignore[arg-type]
    everyone = _Splits(train=[1] * 5, val=[1], test=[1])
    with pytest.raises(HybridflowInputError, match="every customer bought"):
        check_trainable(everyone, AS_OF, 90)  # type: ignore[arg-type]


def test_no_examples_and_too_few_examples_are_refused_with_the_fix():
    with pytest.raises(HybridflowInputError, match="no training examples.*fix: "):
        check_trainable(_Splits(train=[], val=[], test=[]), AS_OF, 90)  # type: ignore[arg-type]
    few = _Splits(train=[0, 1] * 20, val=[0, 0, 1], test=[0, 1] * 10)
    with pytest.raises(
        HybridflowInputError, match=r"too few training examples.*val 3 rows, 1 buying"
    ):
        check_trainable(few, AS_OF, 90)  # type: ignore[arg-type]
    check_trainable(_Splits(train=[0, 1] * 20, val=[0, 1] * 5, test=[0, 1] * 5), AS_OF, 90)  # type: ignore[arg-type]
