"""What the features stage asks of an engine: the customer-level table of the run's cutoffs,
from which each output dataset is published (:mod:`tasks.stages.features` picks the engine)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from infra.datasets import DatasetManifest, SourceEvents
from tasks.data.cutoffs import Cutoff


@dataclass(frozen=True)
class FeatureOutput:
    """A dataset of the stage: the customers seen at ``cutoff`` and their features (and label,
    for a labelled cutoff), published at ``prefix``; ``source`` (the scoring output's), recorded
    in its manifest, names the events it was computed from."""

    cutoff: Cutoff
    prefix: str
    source: SourceEvents | None = None

    def metadata(self) -> dict[str, Any]:
        """What the output's manifest records beside its schema."""
        return self.source.to_metadata() if self.source is not None else {}


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
