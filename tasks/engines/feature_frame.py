"""What the features stage asks of an engine: the customer-level table of the run's cutoffs,
from which each output dataset is published (:mod:`tasks.stages.features` picks the engine)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from infra.storage.datasets import DatasetManifest, SourceEvents
from tasks.data.cutoffs import Cutoff


@dataclass(frozen=True)
class FeatureOutput:
    """A dataset of the stage, published at ``prefix``: the customers seen at the one unlabelled
    cutoff and their features, or the training examples at the labelled ``cutoffs`` (origins,
    newest first; features, ``label`` and ``origin``); ``source`` (the scoring output's),
    recorded in its manifest, names the events it was computed from."""

    cutoffs: tuple[Cutoff, ...]
    prefix: str
    source: SourceEvents | None = None

    def metadata(self) -> dict[str, Any]:
        """What the output's manifest records beside its schema."""
        return self.source.to_metadata() if self.source is not None else {}

    def __post_init__(self) -> None:
        labelled = {c.label_until is not None for c in self.cutoffs}
        if len(labelled) != 1 or (labelled == {False} and len(self.cutoffs) != 1):
            raise ValueError(
                f"{self.prefix}: one unlabelled cutoff or labelled origins, "
                f"got {[c.name for c in self.cutoffs]}"
            )

    @property
    def labelled(self) -> bool:
        """Whether the output is training examples (with ``label`` and ``origin``)."""
        return self.cutoffs[0].label_until is not None


def distinct_cutoffs(outputs: Sequence[FeatureOutput]) -> list[Cutoff]:
    """Every cutoff of ``outputs`` once, by name (an origin two outputs share is one)."""
    seen: dict[str, Cutoff] = {}
    for output in outputs:
        for cutoff in output.cutoffs:
            seen.setdefault(cutoff.name, cutoff)
    return list(seen.values())


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
