"""The features stage on Spark: a task per bucket of the customer-clustered events (DuckDB in
each), or for events that are not clustered one shuffle by customer and a task per partition
(DuckDB in each), gives what the in-process stage gives; a customer's events split between files
meet in one partition, and events after as_of change no feature; a failed task publishes
nothing; a task reads and writes a remote store through its client."""

from __future__ import annotations

import datetime as dt

import pytest

from infra.compute.spark_io import ClusteredLayout, read_dataset, write_dataset, write_observed
from infra.layout import run_dataset_prefix
from infra.storage.arrow_datasets import read_table
from infra.storage.datasets import SourceEvents, find_dataset, read_dataset_manifest
from tasks.data.cutoffs import Origins, end_of_day, micros, pipeline_cutoffs
from tasks.data.demo_events import DemoDataParams, generate_demo_events
from tasks.engines.feature_frame import FeatureOutput
from tasks.engines.in_process.features import InProcessFeatureFrame
from tasks.engines.spark.features_per_bucket import BucketFeatureFrame, bucket_features
from tasks.engines.spark.features_per_partition import PIECES_FOLDER, PartitionFeatureFrame
from tasks.reporting.records import ValidateResult
from tasks.stages.features import feature_frame, features_stage
from tasks.stages.validate import validate_stage

pytestmark = pytest.mark.integration

SPARK = 0  # in_process_rows that sends the stage to Spark
IN_PROCESS = 10**9


@pytest.fixture(scope="module")
def demo_events(tmp_path_factory):
    out = tmp_path_factory.mktemp("bucket-features") / "events"
    generate_demo_events(DemoDataParams(customers=500, days=400, seed=17), out)
    return out


@pytest.fixture
def validated(spark, local_store, demo_events) -> ValidateResult:
    return validate_stage(spark, local_store, "v", str(demo_events), 0.05, use_cache=False)


def _republished(spark, store, validated: ValidateResult, name: str, buckets: int | None):
    """The valid events published again at a prefix of their own: hash-bucketed by customer
    into ``buckets`` files, or (None) two files that split customers between them."""
    events = read_dataset(spark, store, validated.events_prefix)
    prefix = run_dataset_prefix("v", name)
    if buckets is None:
        write_dataset(events.repartition(2), store, prefix)
    else:
        layout = ClusteredLayout("customer_id", buckets)
        write_observed(events.repartition(buckets, "customer_id"), store, prefix, layout=layout)
    return validated.model_copy(update={"events_prefix": prefix})


def _rows(store, prefix: str) -> dict[tuple, dict]:
    """A dataset's rows by customer (and origin, for training examples)."""
    table = read_table(store, read_dataset_manifest(store, prefix))
    rows = {(r.pop("customer_id"), r.pop("origin", None)): r for r in table.to_pylist()}
    assert len(rows) == table.num_rows
    return rows


def _same(expected: dict[tuple, dict], got: dict[tuple, dict]) -> None:
    """Numbers equal to 1e-9; the sequence columns (lists) exactly."""
    assert set(got) == set(expected) and got
    for customer, values in got.items():
        lists = {k for k, v in values.items() if isinstance(v, list)}
        assert {k: values[k] for k in lists} == {k: expected[customer][k] for k in lists}
        numbers = {k: v for k, v in values.items() if k not in lists}
        want = {k: expected[customer][k] for k in numbers}
        assert numbers == pytest.approx(want, rel=1e-9, abs=1e-9), customer


def test_each_engine_is_chosen_by_size_and_layout(spark, local_store, validated):
    outputs = [
        FeatureOutput((c,), f"x/{c.name}")
        for c in pipeline_cutoffs(validated.last_event.date(), 30)
    ]
    clustered = _republished(spark, local_store, validated, "clustered", 3)
    plain = _republished(spark, local_store, validated, "plain", None)
    chosen = {
        "small": feature_frame(spark, local_store, clustered, outputs, IN_PROCESS),
        "clustered": feature_frame(spark, local_store, clustered, outputs, SPARK),
        "validated": feature_frame(spark, local_store, validated, outputs, SPARK),
        "plain": feature_frame(spark, local_store, plain, outputs, SPARK),
    }
    assert {name: type(frame) for name, frame in chosen.items()} == {
        "small": InProcessFeatureFrame,
        "clustered": BucketFeatureFrame,
        "validated": BucketFeatureFrame,
        "plain": PartitionFeatureFrame,
    }


def _names_its_events(store, result, validated) -> None:
    """The scoring features' manifest records the events generation and cutoff they are from
    (what the endpoint seeds its online state from)."""
    source = SourceEvents.of(read_dataset_manifest(store, result.scoring_prefix))
    events = read_dataset_manifest(store, validated.events_prefix)
    assert source is not None
    assert (source.events_prefix, source.events_data_prefix) == (events.prefix, events.data_prefix)
    assert source.cutoff_micros == micros(end_of_day(result.as_of))
    assert SourceEvents.of(read_dataset_manifest(store, result.training_prefix)) is None


@pytest.mark.slow(
    reason="the features stage three ways (Spark tasks per bucket, Spark tasks per partition "
    "after a shuffle, in process) on the same validated demo events"
)
def test_buckets_and_partitions_give_the_in_process_outputs(
    spark, local_store, validated, monkeypatch
):
    # three partitions, so the customers split between the plain events' two files must meet
    monkeypatch.setattr(PartitionFeatureFrame, "partitions", lambda self: 3)
    origins, n = Origins(count=3, stride_days=45), 6  # and the last 6 events per customer
    here = features_stage(
        spark,
        local_store,
        "l",
        validated,
        None,
        90,
        False,
        IN_PROCESS,
        origins=origins,
        sequence_length=n,
    )
    assert len(here.training_origins) == len(here.backtest_origins) == 3
    _names_its_events(local_store, here, validated)
    expected = {
        "training_prefix": _rows(local_store, here.training_prefix),
        "backtest_prefix": _rows(local_store, here.backtest_prefix),
        "scoring_prefix": _rows(local_store, here.scoring_prefix),
    }
    figures = (
        "n_training",
        "n_scoring",
        "n_backtest",
        "events_after_as_of",
        "features",
        "training_origins",
        "backtest_origins",
        "sequence_length",
    )
    for name, buckets in (("clustered", 3), ("plain", None)):
        events = _republished(spark, local_store, validated, name, buckets)
        result = features_stage(
            spark,
            local_store,
            name,
            events,
            None,
            90,
            False,
            SPARK,
            origins=origins,
            sequence_length=n,
        )
        engine = "spark-per-bucket" if buckets is not None else "spark-per-partition"
        assert result.report.engine == engine, result.report
        assert "clustered by customer" in result.report.engine_reason
        # one job of a task per bucket; a shuffle and a task per partition for the plain events
        assert result.report.spark_jobs == (1 if buckets is not None else 2), result.report
        assert [getattr(result, f) for f in figures] == [getattr(here, f) for f in figures]
        assert result.positive_rate == pytest.approx(here.positive_rate, rel=1e-12)
        assert result.backtest_positive_rate == pytest.approx(here.backtest_positive_rate)
        for prefix, rows in expected.items():
            _same(rows, _rows(local_store, getattr(result, prefix)))
        _names_its_events(local_store, result, events)
        manifest = read_dataset_manifest(local_store, result.training_prefix)
        assert len(manifest.files) == (buckets or 3)  # a part per bucket / partition
        # Spark reads the parts with the schema the manifest records.
        training = read_dataset(spark, local_store, result.training_prefix)
        assert training.count() == result.n_training
        assert training.schema["label"].dataType.typeName() == "double"
        assert training.schema["seq_gap_days"].dataType.typeName() == "array"
    assert _shuffle_pieces(local_store) == []  # the shuffle's pieces went with the job


def _shuffle_pieces(store) -> list[str]:
    return [k for k in store.list("") if f"/{PIECES_FOLDER}/" in k]


def test_events_after_as_of_change_no_feature_of_a_partition(
    spark, local_store, validated, monkeypatch
):
    """Point in time on the shuffled path: copies of a third of the customers' events moved
    past as_of (into the scoring horizon) and spread over files that split customers change
    no training example, backtest example or scoring feature, and are counted as ignored."""
    from pyspark.sql import functions as F

    monkeypatch.setattr(PartitionFeatureFrame, "partitions", lambda self: 2)
    as_of = validated.last_event.date()
    here = features_stage(
        spark, local_store, "pit-l", validated, as_of, 90, False, IN_PROCESS, sequence_length=3
    )
    events = read_dataset(spark, local_store, validated.events_prefix)
    later = events.where(F.abs(F.hash("customer_id")) % 3 == 0).withColumn(
        "event_time", F.col("event_time") + F.expr("INTERVAL 30 DAYS")
    )
    later = later.where(F.to_date("event_time") > F.lit(as_of))
    moved = later.count()
    prefix = run_dataset_prefix("v", "with-future")
    write_dataset(events.unionByName(later).repartition(3), local_store, prefix)
    last = validated.last_event + dt.timedelta(days=30)
    future = validated.model_copy(update={"events_prefix": prefix, "last_event": last})
    result = features_stage(
        spark, local_store, "pit-s", future, as_of, 90, False, SPARK, sequence_length=3
    )
    assert result.report.engine == "spark-per-partition"
    assert moved and result.events_after_as_of == moved + here.events_after_as_of
    for name in ("training_prefix", "backtest_prefix", "scoring_prefix"):
        _same(_rows(local_store, getattr(here, name)), _rows(local_store, getattr(result, name)))


@pytest.mark.parametrize("buckets", [2, None], ids=["per-bucket", "per-partition"])
def test_a_failed_task_publishes_nothing(spark, local_store, validated, buckets):
    name = f"broken-{buckets}"
    events = _republished(spark, local_store, validated, name, buckets)
    manifest = read_dataset_manifest(local_store, events.events_prefix)
    local_store.put_bytes(manifest.files[-1], b"not parquet")
    with pytest.raises(Exception, match="parquet|Parquet"):
        features_stage(spark, local_store, name, events, None, 90, False, SPARK)
    assert find_dataset(local_store, run_dataset_prefix(name, "training_examples")) is None
    assert find_dataset(local_store, run_dataset_prefix(name, "backtest_examples")) is None
    assert _shuffle_pieces(local_store) == []


def test_a_task_reads_and_writes_a_remote_store(spark, local_store, validated, s3_store):
    """What a task does with an S3 store (local mode and clusters alike): download its bucket,
    put its parts; the same rows as from the folder store."""
    events = _republished(spark, local_store, validated, "to-s3", 1)
    key = read_dataset_manifest(local_store, events.events_prefix).files[0]
    s3_store.put_file("events/part-0.parquet", local_store.local_path(key))
    cutoffs = pipeline_cutoffs(validated.last_event.date(), 90)
    available = set(validated.available_columns)
    targets = [((c,), f"out/{c.name}.parquet") for c in cutoffs]
    remote, remote_after = bucket_features(s3_store, ["events/part-0.parquet"], available, targets)
    local, local_after = bucket_features(local_store, [key], available, targets)
    assert [p.rows for p in remote] == [p.rows for p in local] and remote[0].rows
    assert [p.positives for p in remote] == [p.positives for p in local]
    assert remote_after == local_after
    for _, target in targets:
        assert s3_store.get_bytes(target) == local_store.get_bytes(target)
