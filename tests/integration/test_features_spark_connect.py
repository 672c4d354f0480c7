"""The features run on Spark Connect as on a classic session: the customer-level table is one
SQL statement whose input goes in as a parameter (Spark Connect analyses lazily, so a temp view
dropped after ``spark.sql`` would be missing when a job runs), and the stage's task per bucket
runs its DuckDB in the server's Python workers, as does the task per partition of events
shuffled by customer (a customer's events split between files; the event after as_of ignored). A child process runs both through a Connect
server it starts on a free loopback port; their features must equal DuckDB's in this process
for the same rows. The validation SQL (its functions defined in the Connect session) runs there
too."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import textwrap

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from infra.stack.services import free_port
from tasks.data.cutoffs import pipeline_cutoffs
from tasks.data.features_duckdb import InProcessFeatures
from tasks.data.validation_duckdb import GOOD_EVENTS_SCHEMA

pytestmark = pytest.mark.integration

AS_OF = dt.date(2025, 1, 27)
HORIZON_DAYS = 5
ALL = {"event_type", "quantity", "category", "channel"}


def _rows() -> list[tuple]:
    rows = [
        (
            "a",
            dt.datetime(2025, 1, d, 10, tzinfo=dt.UTC),
            2.0 + d,
            "purchase" if d % 3 else "view",
            1 + d % 2,
            "x" if d % 2 else "y",
            "web",
        )
        for d in range(1, 29)
    ]
    rows += [("b", dt.datetime(2025, 1, 3, tzinfo=dt.UTC), 5.0, "purchase", 2, "y", None)]
    rows += [("c", dt.datetime(2025, 1, 20, tzinfo=dt.UTC), 1.0, "add_to_cart", 1, None, "app")]
    return rows


CHILD = textwrap.dedent(
    """
    import datetime as dt, json, os, sys
    from pyspark.sql import SparkSession
    from tasks.data.cutoffs import pipeline_cutoffs
    from tasks.data.features import customer_features_at, cutoff_features
    port, rows = int(sys.argv[1]), json.loads(sys.stdin.read())
    from pyspark import SparkConf, SparkContext
    from pyspark.sql.connect.session import SparkSession as ConnectSession
    from infra.compute.jvm_archive import class_sharing
    from infra.compute.spark import CONF_DIR, QUICK_JIT_OPTIONS
    from infra.settings import get_settings
    # the installation's class archive, as hybridflow's own drivers map it
    sharing = class_sharing(get_settings().class_archive_dir(), CONF_DIR / "log4j2.properties")
    os.environ["SPARK_CONF_DIR"] = str(sharing.conf_dir)
    conf = SparkConf().setMaster("local[2]").setAll([
        ("spark.plugins", "org.apache.spark.sql.connect.SparkConnectPlugin"),
        # the quick JIT tier, as hybridflow's own local drivers of small inputs run
        ("spark.driver.extraJavaOptions", f"{QUICK_JIT_OPTIONS} {sharing.java_options}"),
        ("spark.connect.grpc.binding.address", "127.0.0.1"),
        ("spark.connect.grpc.binding.port", str(port)),
        ("spark.driver.host", "127.0.0.1"), ("spark.driver.bindAddress", "127.0.0.1"),
        ("spark.sql.session.timeZone", "UTC"), ("spark.ui.enabled", "false"),
    ])
    SparkSession(SparkContext.getOrCreate(conf))  # the server: a local driver with Connect
    os.environ["SPARK_CONNECT_MODE_ENABLED"] = "1"  # functions build Connect columns from here
    spark = ConnectSession.builder.remote(f"sc://127.0.0.1:{port}").getOrCreate()
    assert type(spark).__module__.startswith("pyspark.sql.connect"), type(spark)
    rows = [(r[0], dt.datetime.fromisoformat(r[1]), *r[2:]) for r in rows]
    events = spark.createDataFrame(rows, "customer_id string, event_time timestamp, "
        "amount double, event_type string, quantity int, category string, channel string")
    available = {"event_type", "quantity", "category", "channel"}
    wide = customer_features_at(events, list(pipeline_cutoffs(dt.date(2025, 1, 27), 5)), available)
    out = {}
    for cutoff in pipeline_cutoffs(dt.date(2025, 1, 27), 5):
        rows = cutoff_features(wide, cutoff, available).collect()
        out[cutoff.name] = {r["customer_id"]: r.asDict() for r in rows}
    print("FEATURES " + json.dumps(out))
    # the stage's Spark path: a task per bucket (one file here), DuckDB in each
    import tempfile
    import pyarrow.parquet as pq
    from infra.storage.arrow_datasets import read_table
    from infra.storage.store import LocalFolderStore
    from tasks.engines.feature_frame import FeatureOutput
    from tasks.engines.spark.features_per_bucket import BucketFeatureFrame
    store = LocalFolderStore(tempfile.mkdtemp())
    store.local_path("events").mkdir()
    pq.write_table(events.toArrow(), store.local_path("events/part-0.parquet"))
    outputs = [FeatureOutput((c,), f"out/{c.name}") for c in pipeline_cutoffs(dt.date(2025, 1, 27), 5)]
    with BucketFeatureFrame(spark, store, [["events/part-0.parquet"]], outputs, available) as frame:
        published = {o.cutoffs[0].name: frame.publish(o)[0] for o in outputs}
        assert frame.spark_jobs is None  # Connect: no SparkContext to count them
    out = {name: {r["customer_id"]: r for r in read_table(store, m).to_pylist()}
           for name, m in published.items()}
    print("BUCKETS " + json.dumps(out, default=str))  # a labelled output's origin is a date
    # the stage's path for events not clustered by customer: a shuffle by customer, then a
    # task per partition (three here) running DuckDB; every customer's events split between
    # two files
    from infra.storage.datasets import new_data_prefix, publish_written_dataset
    from tasks.engines.spark.features_per_partition import PartitionFeatureFrame
    table = events.toArrow()
    data = new_data_prefix("plain")
    keys = [f"{data}/part-{i}.parquet" for i in (0, 1)]
    store.local_path(data).mkdir(parents=True)
    for i, key in enumerate(keys):
        pq.write_table(table.take(list(range(i, table.num_rows, 2))), store.local_path(key))
    publish_written_dataset(store, "plain", data, keys, rows=table.num_rows)
    class ThreePartitions(PartitionFeatureFrame):
        def partitions(self):
            return 3
    outputs = [FeatureOutput((c,), f"part/{c.name}") for c in pipeline_cutoffs(dt.date(2025, 1, 27), 5)]
    with ThreePartitions(spark, store, "plain", outputs, available) as frame:
        published = {o.cutoffs[0].name: frame.publish(o)[0] for o in outputs}
        after = frame.events_after()
    out = {name: {r["customer_id"]: r for r in read_table(store, m).to_pylist()}
           for name, m in published.items()}
    out["_events_after"] = after
    print("PARTITIONS " + json.dumps(out, default=str))
    from tasks.data.validation import conform_events, split_valid_events
    parts = split_valid_events(conform_events(events.unionByName(events.limit(1))), 2)
    reasons = [r["reason"] for r in parts.quarantine.collect()]
    print("VALIDATED " + json.dumps({"good": parts.good.count(), "quarantine": reasons}))
    spark.stop()
    """
)


@pytest.mark.slow(
    reason="a child process starts a second local Spark driver (JVM) with the Connect server, and the server's Python workers run DuckDB per bucket"
)
def test_features_on_spark_connect_equal_duckdb():
    rows = _rows()
    payload = json.dumps([(r[0], r[1].isoformat(), *r[2:]) for r in rows])
    env = os.environ | {
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYARROW_IGNORE_TIMEZONE": "1",
        "PYSPARK_PYTHON": sys.executable,  # the server's Python workers (Connect reads the env)
    }
    env.pop("SPARK_REMOTE", None)
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(free_port())],
        input=payload,
        capture_output=True,
        text=True,
        env=env,
        timeout=420,  # three Connect jobs with Python workers, on a shared box
    )
    printed = {
        line.split(" ", 1)[0]: json.loads(line.split(" ", 1)[1])
        for line in done.stdout.splitlines()
        if line.startswith(("FEATURES ", "BUCKETS ", "PARTITIONS ", "VALIDATED "))
    }
    assert done.returncode == 0 and len(printed) == 4, done.stderr[-3000:]
    assert printed.pop("VALIDATED") == {"good": len(rows), "quarantine": ["duplicate_event"]}
    # point in time on the shuffled path: the one event after as_of is ignored and counted
    assert printed["PARTITIONS"].pop("_events_after") == 1

    table = pa.Table.from_pylist(
        [dict(zip(GOOD_EVENTS_SCHEMA.names, r, strict=True)) for r in rows], GOOD_EVENTS_SCHEMA
    )
    with InProcessFeatures(table, list(pipeline_cutoffs(AS_OF, HORIZON_DAYS)), ALL) as duck:
        for cutoff in pipeline_cutoffs(AS_OF, HORIZON_DAYS):
            expected = {r.pop("customer_id"): r for r in duck.cutoff_table(cutoff).to_pylist()}
            for way, on_connect in printed.items():
                got = on_connect[cutoff.name]
                assert set(got) == set(expected), (way, cutoff.name)
                for customer, features in expected.items():
                    got[customer].pop("customer_id")
                    origin = got[customer].pop("origin", None)
                    if way != "FEATURES" and cutoff.label_until is not None:
                        assert origin == cutoff.origin().isoformat(), (way, customer)
                    assert got[customer] == pytest.approx(features, rel=1e-9), (way, customer)
    # and the scoring features at T are those of the events up to T only
    score = pipeline_cutoffs(AS_OF, HORIZON_DAYS).score
    until_t = table.filter(
        pc.less_equal(table["event_time"], pa.scalar(score.at, table.schema[1].type))
    )
    with InProcessFeatures(until_t, [score], ALL) as duck:
        expected = {r.pop("customer_id"): r for r in duck.cutoff_table(score).to_pylist()}
    got = printed["PARTITIONS"][score.name]
    assert set(got) == set(expected) == {"a", "b", "c"}
    for customer, features in expected.items():
        got[customer].pop("customer_id", None)
        assert got[customer] == pytest.approx(features, rel=1e-9), customer
