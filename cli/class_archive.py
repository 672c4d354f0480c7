"""Recording the local driver's JVM class archive (:mod:`infra.compute.jvm_archive`) by running the CPU
stages once on a tiny synthetic input: Parquet and CSV reads, validation and its bucketed write,
features at both cut-offs, the split and the normaliser, drift quantiles and bins. The classes
those load are the ones every later run maps from the archive instead of loading them."""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

import pyarrow.csv as pacsv
import pyarrow.parquet as pq
from pyspark.sql import SparkSession

from infra.compute.jvm_archive import archive_path, record_archive
from infra.compute.spark import get_spark
from infra.compute.spark_io import read_dataset
from infra.settings import HybridflowSettings
from infra.storage.store import LocalFolderStore
from tasks.data.demo_events import DemoDataParams, generate_demo_events
from tasks.data.drift import bin_counts, quantile_edges, unseen_count
from tasks.data.input_formats import InputOptions
from tasks.stages.features import build_features, resolve_as_of
from tasks.stages.preprocess import preprocess_stage
from tasks.stages.validate import validate_events

log = logging.getLogger(__name__)

WORKLOAD_CUSTOMERS = 200


def run_cpu_stages_once(spark: SparkSession) -> None:
    """The CPU stages on a few hundred synthetic customers, in a temporary folder store."""
    with tempfile.TemporaryDirectory(prefix="hf-class-archive-") as tmp:
        work = Path(tmp)
        events = work / "events"
        generate_demo_events(DemoDataParams(customers=WORKLOAD_CUSTOMERS, days=400, seed=5), events)
        csv = work / "events.csv"
        pacsv.write_csv(pq.read_table(events), csv)
        store = LocalFolderStore(work / "store")
        validate_events(spark, store, "archive-csv", csv, InputOptions())
        validated = validate_events(spark, store, "archive", events, InputOptions())
        as_of = resolve_as_of(validated, None, 90)
        # Spark's own stages (in_process_rows=0): their classes are what the archive is for.
        features = build_features(spark, store, "archive", validated, as_of, 90, in_process_rows=0)
        prepared = preprocess_stage(
            spark, store, features, 7, use_cache=False, run_id="archive", in_process_rows=0
        )
        snapshot = read_dataset(spark, store, prepared.snapshot_prefix)
        columns = [c for c, t in snapshot.dtypes if t in ("double", "int", "bigint")]
        bin_counts(snapshot, quantile_edges(snapshot, columns, 10, 1000))
        unseen_count(read_dataset(spark, store, features.scoring_prefix), snapshot)


def record_class_archive(settings: HybridflowSettings, force: bool = False) -> Path:
    """This installation's class archive, recorded now unless it exists (or ``force``).
    Must run in a process that has no Spark session yet."""
    folder = settings.class_archive_dir()
    existing = archive_path(folder)
    if existing.exists() and not force:
        log.info("JVM class archive present: %s", existing)
        return existing
    path = record_archive(
        folder,
        lambda partial: get_spark(settings, record_class_archive=partial),
        run_cpu_stages_once,
    )
    log.info("JVM class archive recorded: %s (%.0f MB)", path, path.stat().st_size / 2**20)
    return path
