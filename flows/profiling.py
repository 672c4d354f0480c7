"""Flow ``profile`` (one deployment per pool): a short profiling run that teaches the router.

The pipeline runs embedded on a sample of the customers against a scratch store (no model is
registered, nothing is published), and each stage's measurements are recorded in the real store
as profiles of the pool this flow runs on.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from pydantic import BaseModel, Field

from flows.context import current_pool
from flows.params import RunInputs, resolve
from flows.params_flow import params_flow
from flows.pipeline import PipelineParams, pipeline_flow
from infra.compute.spark import get_spark
from infra.routing.accounting import embedded_pool, record_stage_profiles
from tasks.data.input_formats import InputOptions
from tasks.data.sampling import sample_events


class ProfileParams(RunInputs):
    """Parameters of a profiling run."""

    events: str = Field(description="Parquet/CSV file or folder of events")
    sample_fraction: float = Field(default=0.05, gt=0.0, le=1.0, description="share of customers")


class ProfileResult(BaseModel):
    """Which pool was profiled and how many stage profiles were recorded."""

    pool: str
    sample_rows: int
    profiles: int


@params_flow(name="profile")
def profile_flow(params: ProfileParams) -> ProfileResult:
    """Run the pipeline on a sample here and record per-stage profiles for this pool."""
    run = resolve(params)
    scratch = Path(tempfile.mkdtemp(prefix="hf-profile-"))
    try:
        rows, ts_format = sample_events(
            get_spark(run.settings),
            params.events,
            run.input,
            params.sample_fraction,
            scratch / "events",
        )
        summary = pipeline_flow(
            PipelineParams(
                events=str(scratch / "events"),
                as_of=params.as_of,
                horizon_days=params.horizon_days,
                input=InputOptions(timestamp_format=ts_format),
                store=str(scratch / "store"),
                mode="embedded",
                use_cache=False,
            )
        )
        trained_on = next(r.device for r in summary.stages if r.name == "train")
        pool = current_pool(default=embedded_pool(trained_on))
        recorded = record_stage_profiles(
            run.store,
            [r.profile(summary.run_id, pool=pool) for r in summary.stages if not r.cached],
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return ProfileResult(pool=pool, sample_rows=rows, profiles=len(recorded))
