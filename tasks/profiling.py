"""Short profiling runs: the pipeline on a customer sample, measured on the pool it runs on.

The router falls back to rules for a pool without profiles; a profiling run on that pool gives
it measurements. The sample keeps whole customer histories (a hash of the id picks customers),
so every stage does representative work at a fraction of the size.
"""

from __future__ import annotations

from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from infra.profiles import StageProfile, record_profile
from infra.store import ObjectStore
from tasks.input_formats import InputOptions, read_events
from tasks.stage_records import StageReport

SAMPLE_BUCKETS = 10_000


def sample_events(
    spark: SparkSession, events: str, options: InputOptions, fraction: float, out: Path
) -> tuple[int, str | None]:
    """Write the events of about ``fraction`` of the customers to ``out`` as Parquet with
    contract column names; returns the row count and the input's timestamp format."""
    raw = read_events(spark, events, options)
    bucket = F.pmod(F.xxhash64(F.col("customer_id").cast("string")), F.lit(SAMPLE_BUCKETS))
    sample = raw.df.filter(bucket < int(round(fraction * SAMPLE_BUCKETS)))
    sample.write.mode("overwrite").parquet(str(out))
    return spark.read.parquet(str(out)).count(), raw.timestamp_format


def record_stage_profiles(
    store: ObjectStore, pool: str, run_id: str, stages: list[StageReport], model_params: int = 0
) -> list[StageProfile]:
    """Record what each stage of a profiling run measured, attributed to ``pool``."""
    profiles = [
        StageProfile(
            stage=r.name,
            pool=pool,
            device=r.device,
            rows=r.rows_in or 0,
            model_params=model_params if r.name in ("train", "batch_inference") else 0,
            seconds=r.seconds,
            peak_memory_mb=r.peak_memory_mb,
            run_id=run_id,
        )
        for r in stages
        if not r.cached
    ]
    for p in profiles:
        record_profile(store, p)
    return profiles
