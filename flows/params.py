"""Run parameters, declared once, and their defaults from the settings resolved in one place.

:class:`RunInputs` is what every run shares (events, T, H, input options, store, ...).
:class:`StageParams` is what every stage flow and dispatch unit takes: the pipeline hands the
same object to each of them, in-process or through ``run_deployment``, and each stage reads the
fields it needs. A field left ``None`` means "the setting"; :func:`resolve` says which.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from infra.settings import HORIZON_DAYS_MAX, HORIZON_DAYS_MIN, HybridflowSettings, get_settings
from infra.storage.store import ObjectStore, open_store
from tasks.data.input_formats import InputOptions, input_defaults

DevicePreference = Literal["auto", "cuda", "cpu"]  # resolved by infra.compute.devices.select_device


class RunInputs(BaseModel):
    """What a run works on, shared by the pipeline, its stages, refreshes and profiling runs."""

    model_config = ConfigDict(extra="forbid")

    events: str | None = Field(default=None, description="Parquet/CSV file or folder of events")
    as_of: dt.date | None = Field(
        default=None, description="T (default: HYBRIDFLOW_AS_OF, else the last event's date)"
    )
    horizon_days: int | None = Field(
        default=None,
        ge=HORIZON_DAYS_MIN,
        le=HORIZON_DAYS_MAX,
        description="H (default: HYBRIDFLOW_HORIZON_DAYS)",
    )
    as_of_after_events: bool = Field(
        default=False,
        description="accept an as_of after the last valid event's day (the label window then "
        "holds fewer days of events than the horizon; the run says how many)",
    )
    max_bad_fraction: float | None = Field(
        default=None, ge=0.0, le=1.0, description="default: HYBRIDFLOW_MAX_BAD_FRACTION"
    )
    input: InputOptions = Field(default_factory=InputOptions, description="how to read events")
    use_cache: bool | None = Field(
        default=None, description="False: recompute CPU stages (default: HYBRIDFLOW_STAGE_CACHE)"
    )
    device: DevicePreference = Field(default="auto", description="where the train stage runs")
    store: str | None = Field(default=None, description="store URI (default: HYBRIDFLOW_STORE)")


class StageParams(RunInputs):
    """Parameters of every stage flow and dispatch unit (each stage reads what it needs)."""

    run_id: str | None = Field(
        default=None, description="pipeline run whose stage manifests to read and write"
    )
    fresh: bool = Field(default=False, description="train: drop this training's checkpoints")
    scratch: bool = Field(default=False, description="train: no warm start from production")
    model_version: str | None = Field(
        default=None, description="batch inference: score with this version (default: production)"
    )
    families: list[str] | None = Field(
        default=None,
        description='train: the model families that contend, e.g. ["rfm", "logistic", '
        '"gbm", "mlp"] (default: HYBRIDFLOW_TRAIN__FAMILIES); the champion goes to the gate',
    )


@dataclass(frozen=True)
class ResolvedRun:
    """A run's inputs with every default filled in from the settings."""

    settings: HybridflowSettings
    store: ObjectStore
    as_of: dt.date | None
    horizon_days: int
    max_bad_fraction: float
    input: InputOptions
    use_cache: bool


def resolve(params: RunInputs) -> ResolvedRun:
    """``params`` over the settings: the one place where "None means the setting" is decided."""
    settings = get_settings()
    return ResolvedRun(
        settings=settings,
        store=open_store(params.store or settings.store),
        as_of=params.as_of or settings.as_of,
        horizon_days=settings.horizon_days if params.horizon_days is None else params.horizon_days,
        max_bad_fraction=(
            settings.max_bad_fraction
            if params.max_bad_fraction is None
            else params.max_bad_fraction
        ),
        input=params.input.merged_with(input_defaults(settings)),
        use_cache=settings.stage_cache if params.use_cache is None else params.use_cache,
    )
