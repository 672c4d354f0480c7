"""What the drift check records: a model version's reference and a check's table."""

from __future__ import annotations

import datetime as dt
from typing import Literal

from pydantic import BaseModel, Field

from tasks.data.stability import Status, status

Measure = Literal["psi", "unseen_share"]


class BinnedReference(BaseModel):
    """One distribution on the training side: its bin edges and the rows in each bin."""

    edges: list[float]
    counts: dict[int, int]


class DriftReference(BaseModel):
    """What drift checks of one model version compare with (recorded once, at promotion)."""

    model_version: str
    built_at: dt.datetime = Field(default_factory=lambda: dt.datetime.now(dt.UTC))
    snapshot_prefix: str
    snapshot_data_prefix: str
    training_as_of: dt.date
    horizon_days: int
    rows: int
    customers_prefix: str
    features: dict[str, BinnedReference]
    score: BinnedReference | None = Field(
        default=None, description="the version's scores on its snapshot's test split"
    )


class DriftRow(BaseModel):
    """One line of the drift table."""

    feature: str
    measure: Measure
    value: float | None
    threshold: float
    status: Status

    @classmethod
    def measured(
        cls,
        feature: str,
        measure: Measure,
        value: float | None,
        threshold: float,
        ignored: bool = False,
    ) -> DriftRow:
        """A row whose status follows from the value and the threshold (``ignored``: shown,
        never drift)."""
        return cls(
            feature=feature,
            measure=measure,
            value=value,
            threshold=threshold,
            status="ignored" if ignored else status(value, threshold),
        )


class DriftReport(BaseModel):
    """A drift check: the scoring data at ``as_of`` against ``model_version``'s training data."""

    run_id: str
    as_of: dt.date
    model_version: str
    reference_as_of: dt.date
    reference_horizon_days: int
    rows_compared: int
    rows: list[DriftRow]
    seconds: float
    engine: str | None = Field(default=None, description="the engine that aggregated the data")
    engine_reason: str | None = Field(default=None, description="why that engine")

    @property
    def drifted(self) -> list[DriftRow]:
        """The rows above their threshold."""
        return [r for r in self.rows if r.status == "drift"]

    @property
    def status(self) -> Literal["drifted", "stable"]:
        """``drifted`` when any measure is above its threshold."""
        return "drifted" if self.drifted else "stable"
