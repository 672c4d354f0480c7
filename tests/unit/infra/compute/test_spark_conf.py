"""Spark settings pass through from the environment (cluster readiness), with sane defaults."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from infra.compute.spark import (
    FULL_JIT_FROM_ROWS,
    FULL_JIT_OPTIONS,
    QUICK_JIT_OPTIONS,
    is_local_master,
    spark_conf_for,
)
from infra.settings import HybridflowSettings


def test_defaults_are_local_loopback_with_memory_partitions_and_arrow_batch(monkeypatch):
    for var in ("MASTER", "CONF", "DRIVER_MEMORY", "EXECUTOR_MEMORY", "SHUFFLE_PARTITIONS"):
        monkeypatch.delenv(f"HYBRIDFLOW_SPARK_{var}", raising=False)
    monkeypatch.delenv("HYBRIDFLOW_SPARK_ARROW_BATCH_SIZE", raising=False)
    conf = spark_conf_for(HybridflowSettings(_env_file=None))
    assert conf["spark.master"] == "local[*]"
    assert conf["spark.driver.memory"] == "4g"
    assert conf["spark.executor.memory"] == "4g"
    assert conf["spark.sql.shuffle.partitions"] == "8"
    assert conf["spark.sql.execution.arrow.maxRecordsPerBatch"] == "10000"
    assert conf["spark.driver.bindAddress"] == "127.0.0.1"
    assert conf["spark.python.worker.reuse"] == "true"
    assert "TieredStopAtLevel=1" in conf["spark.driver.extraJavaOptions"]  # local driver only


def test_cluster_master_and_spark_conf_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("HYBRIDFLOW_SPARK_MASTER", "spark://spark-master:7077")
    monkeypatch.setenv(
        "HYBRIDFLOW_SPARK_CONF",
        '{"spark.executor.memory": "8g", "spark.executor.cores": "4",'
        ' "spark.hadoop.fs.s3a.endpoint": "https://s3.example.com"}',
    )
    monkeypatch.setenv("HYBRIDFLOW_SPARK_SHUFFLE_PARTITIONS", "400")
    monkeypatch.setenv("HYBRIDFLOW_SPARK_ARROW_BATCH_SIZE", "20000")
    conf = spark_conf_for(HybridflowSettings(_env_file=None))
    assert conf["spark.master"] == "spark://spark-master:7077"
    assert conf["spark.executor.memory"] == "8g"  # spark_conf wins over the typed setting
    assert conf["spark.executor.cores"] == "4"
    assert conf["spark.hadoop.fs.s3a.endpoint"] == "https://s3.example.com"
    assert conf["spark.sql.shuffle.partitions"] == "400"
    assert conf["spark.sql.execution.arrow.maxRecordsPerBatch"] == "20000"
    # executors on other hosts must reach the driver: no loopback binding on a cluster
    assert "spark.driver.bindAddress" not in conf
    assert "spark.driver.host" not in conf
    assert "spark.driver.extraJavaOptions" not in conf


def test_spark_conf_may_set_the_master_itself():
    settings = HybridflowSettings(_env_file=None, spark_conf={"spark.master": "yarn"})
    assert spark_conf_for(settings)["spark.master"] == "yarn"


def test_spark_conf_rejects_keys_that_are_not_spark_settings():
    with pytest.raises(ValidationError, match="fs.s3a.access.key"):
        HybridflowSettings(_env_file=None, spark_conf={"fs.s3a.access.key": "x"})


@pytest.mark.parametrize(
    ("master", "local"),
    [
        ("local", True),
        ("local[2]", True),
        ("local[*]", True),
        ("local-cluster[2,1,1024]", True),
        ("yarn", False),
        ("spark://h:7077", False),
        ("k8s://https://api:6443", False),
    ],
)
def test_is_local_master(master, local):
    assert is_local_master(master) is local


def test_the_local_jvm_is_sized_by_the_input_unless_set(monkeypatch):
    monkeypatch.delenv("HYBRIDFLOW_SPARK_LOCAL_JAVA_OPTIONS", raising=False)
    monkeypatch.delenv("HYBRIDFLOW_SPARK_MASTER", raising=False)
    settings = HybridflowSettings(_env_file=None)

    def java(rows, s=settings):
        return spark_conf_for(s, rows).get("spark.driver.extraJavaOptions")

    assert java(None) == java(FULL_JIT_FROM_ROWS - 1) == QUICK_JIT_OPTIONS  # unknown: small
    assert java(FULL_JIT_FROM_ROWS) == java(30_000_000) == FULL_JIT_OPTIONS
    assert "TieredStopAtLevel" not in FULL_JIT_OPTIONS and "UseSerialGC" in FULL_JIT_OPTIONS
    monkeypatch.setenv("HYBRIDFLOW_SPARK_LOCAL_JAVA_OPTIONS", "-Xss4m")
    assert java(30_000_000, HybridflowSettings(_env_file=None)) == "-Xss4m"
    monkeypatch.setenv("HYBRIDFLOW_SPARK_LOCAL_JAVA_OPTIONS", "")  # the JVM's own defaults
    assert java(None, HybridflowSettings(_env_file=None)) is None
    monkeypatch.setenv("HYBRIDFLOW_SPARK_MASTER", "spark://127.0.0.1:7077")  # executors' JVMs
    assert java(30_000_000, HybridflowSettings(_env_file=None)) is None
