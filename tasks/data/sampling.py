"""A customer sample of the events, for short profiling runs that teach the router.

The sample keeps whole customer histories (a hash of the id picks customers), so every stage
does representative work at a fraction of the size.
"""

from __future__ import annotations

from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from tasks.data.input_formats import InputOptions, read_events

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
