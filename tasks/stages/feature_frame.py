"""What the features stage asks of an engine: the customer-level table of the run's cutoffs,
from which each output dataset is published (:mod:`tasks.stages.features` picks the engine)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from infra.datasets import DatasetManifest
from tasks.data.cutoffs import Cutoff


@dataclass(frozen=True)
class FeatureOutput:
    """A dataset of the stage: the customers seen at ``cutoff`` and their features (and label,
    for a labelled cutoff), published at ``prefix``."""

    cutoff: Cutoff
    prefix: str


class FeatureFrame(Protocol):
    """One engine's customer-level table of the features at its outputs' cutoffs, inside its
    ``with`` block; ``spark_jobs`` is the jobs it ran, known once the block is left."""

    spark_jobs: int | None

    def __enter__(self) -> FeatureFrame: ...

    def __exit__(self, *exc: object) -> None: ...

    def publish(self, output: FeatureOutput) -> tuple[DatasetManifest, float]:
        """Publish ``output`` (one of the frame's); with its label rate (0.0 when unlabelled)."""
        ...

    def events_after(self) -> int:
        """Events after the latest cutoff."""
        ...
