"""The stack's engines as `up` builds them: loopback-only command lines without secrets, the
generated password's file, the Prefect server's database environment, stop order, sizes."""

from __future__ import annotations

import os
import pwd
import shutil
import stat
import tempfile
from pathlib import Path

import pytest

from infra.compute.jvm_archive import archive_path, conf_dir
from infra.compute.spark import CONF_DIR, QUICK_JIT_OPTIONS
from infra.errors import HybridflowInputError
from infra.settings import HybridflowSettings
from infra.stack import engines, postgres, spark_cluster
from infra.stack.spark_cluster import SparkClusterSpec, SparkEndpoints


def test_postgres_listens_on_loopback_only_and_its_command_holds_no_secret(tmp_path):
    secret = postgres.password(tmp_path / "pg")
    command = postgres.server_command(tmp_path / "pg", 5555)
    assert command[0].endswith("/postgres") and os.access(command[0], os.X_OK)
    assert command[command.index("-h") + 1] == "127.0.0.1"
    assert command[command.index("-k") + 1] == "", "no Unix socket"
    assert command[command.index("-p") + 1] == "5555"
    assert not any(secret in part for part in command)


def test_the_password_is_generated_once_into_a_private_file(tmp_path):
    secret = postgres.password(tmp_path / "pg")
    path = tmp_path / "pg" / "password"
    assert len(secret) >= 24
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert postgres.password(tmp_path / "pg") == secret, "a second up reuses it"


def test_only_the_server_environment_carries_the_password():
    info = postgres.DatabaseInfo(kind="postgres", location="/x/data", port=5555)
    env = postgres.prefect_server_env(info, "s3cret")
    assert env["PREFECT_SERVER_DATABASE_DRIVER"] == "postgresql+asyncpg"
    assert env["PREFECT_SERVER_DATABASE_HOST"] == "127.0.0.1"
    assert env["PREFECT_SERVER_DATABASE_PORT"] == "5555"
    assert env["PREFECT_SERVER_DATABASE_PASSWORD"] == "s3cret"
    assert "s3cret" not in info.describe() and "s3cret" not in info.model_dump_json()
    assert "127.0.0.1:5555/prefect" in info.describe()


@pytest.fixture
def open_tmp():
    """A folder under /tmp that other users may pass through (pytest's own tmp is 0700)."""
    path = Path(tempfile.mkdtemp(prefix="hf-open-"))
    os.chmod(path, 0o711)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="only root hands PostgreSQL to another user")
def test_a_folder_the_postgres_user_cannot_pass_is_named(open_tmp):
    closed = open_tmp / "closed"
    (closed / "stack").mkdir(parents=True)
    os.chmod(closed, 0o700)
    assert postgres.unreachable_folder(closed / "stack", postgres.SYSTEM_USER) == closed
    with pytest.raises(HybridflowInputError, match="HYBRIDFLOW_STACK_DIR") as refused:
        postgres.initialize(closed / "stack" / "postgres", open_tmp / "pg.log")
    assert str(closed) in str(refused.value)
    os.chmod(closed, 0o711)
    assert postgres.unreachable_folder(closed / "stack", postgres.SYSTEM_USER) is None


def test_run_as_is_the_postgres_user_for_root_only():
    expected = postgres.SYSTEM_USER if os.geteuid() == 0 else None
    assert postgres.run_as() == expected
    if expected:
        assert pwd.getpwnam(expected).pw_uid != 0


def test_spark_daemons_bind_loopback_without_the_fixed_rest_port(tmp_path):
    props = spark_cluster.write_properties(tmp_path)
    assert "spark.master.rest.enabled false" in props.read_text()
    master = spark_cluster.master_command(7077, 8080, props)
    assert master[master.index("--host") + 1] == "127.0.0.1"
    assert master[master.index("--properties-file") + 1] == str(props)
    spec = SparkClusterSpec(workers=2, worker_cores=1, worker_memory="1g")
    worker = spark_cluster.worker_command("spark://127.0.0.1:7077", spec, tmp_path / "w", props)
    assert worker[worker.index("--cores") + 1] == "1"
    assert worker[worker.index("--memory") + 1] == "1g"
    assert worker[-1] == "spark://127.0.0.1:7077"


def test_the_connect_server_is_a_loopback_driver_sized_for_the_cluster():
    spec = SparkClusterSpec(workers=3, worker_cores=2, worker_memory="2g", driver_memory="1g")
    command = spark_cluster.connect_command("spark://127.0.0.1:7077", 15002, 4040, spec)
    conf = dict(
        arg.split("=", 1)
        for prev, arg in zip(command, command[1:], strict=False)
        if prev == "--conf"
    )
    assert conf["spark.connect.grpc.binding.address"] == "127.0.0.1"
    assert conf["spark.connect.grpc.binding.port"] == "15002"
    assert conf["spark.driver.bindAddress"] == "127.0.0.1"
    assert conf["spark.default.parallelism"] == "6"
    assert conf["spark.executor.memory"] == "2g"
    assert conf["spark.connect.session.manager.defaultSessionTimeout"] == "7d"
    assert command[command.index("--class") + 1] == spark_cluster.CONNECT_CLASS
    assert command[command.index("--driver-memory") + 1] == "1g"
    # the quick JIT tier for the server's driver and its executors (and SPARK_DAEMON_JAVA_OPTS
    # for the master and workers), unless the settings say otherwise
    assert conf["spark.driver.extraJavaOptions"] == QUICK_JIT_OPTIONS
    assert conf["spark.executor.extraJavaOptions"] == QUICK_JIT_OPTIONS
    assert spark_cluster.daemon_env({}, spec)["SPARK_DAEMON_JAVA_OPTS"] == QUICK_JIT_OPTIONS
    defaults = spec.model_copy(update={"java_options": ""})
    plain = spark_cluster.connect_command("spark://127.0.0.1:7077", 15002, 4040, defaults)
    assert not any("JavaOptions" in arg for arg in plain)


def test_cluster_size_comes_from_settings_and_refuses_negative_workers():
    settings = HybridflowSettings(stack_spark_workers=3, stack_spark_worker_memory="2g")
    assert spark_cluster.spark_spec(settings) == SparkClusterSpec(
        workers=3,
        worker_cores=1,
        worker_memory="2g",
        driver_memory="1g",
        class_archive_dir=settings.class_archive_dir(),
    )
    assert spark_cluster.spark_spec(settings, 0).workers == 0
    chosen = HybridflowSettings(stack_spark_java_options="-XX:+UseSerialGC")
    assert spark_cluster.spark_spec(chosen).java_options == "-XX:+UseSerialGC"
    with pytest.raises(HybridflowInputError, match="--spark-workers"):
        spark_cluster.spark_spec(settings, -1)


def test_every_jvm_of_the_cluster_maps_the_installations_class_archive(tmp_path):
    """Master and workers (SPARK_DAEMON_JAVA_OPTS), the Connect server and its executors
    (extraJavaOptions) run with the archive's empty conf folder and map the archive when it is
    recorded; with the archive switched off, Spark's conf folder and no archive."""
    settings = HybridflowSettings(_env_file=None, spark_class_archive_dir=tmp_path)
    spec = spark_cluster.spark_spec(settings)
    mapped = f"-XX:SharedArchiveFile={archive_path(tmp_path)}"

    def options() -> tuple[dict[str, str], dict[str, str]]:
        command = spark_cluster.connect_command("spark://127.0.0.1:7077", 15002, 4040, spec)
        pairs = zip(command, command[1:], strict=False)
        conf = dict(arg.split("=", 1) for prev, arg in pairs if prev == "--conf")
        return spark_cluster.daemon_env({}, spec), conf

    env, conf = options()
    assert env["SPARK_CONF_DIR"] == str(conf_dir(tmp_path)) and not any(
        conf_dir(tmp_path).iterdir()
    )
    assert mapped not in env["SPARK_DAEMON_JAVA_OPTS"], "no archive recorded yet"
    archive_path(tmp_path).write_bytes(b"recorded")
    env, conf = options()
    for options_of in (
        env["SPARK_DAEMON_JAVA_OPTS"],
        conf["spark.driver.extraJavaOptions"],
        conf["spark.executor.extraJavaOptions"],
    ):
        assert options_of.split()[:2] == QUICK_JIT_OPTIONS.split()
        assert mapped in options_of.split()
        assert "-Dlog4j.configurationFile=file:" + str(CONF_DIR / "log4j2.properties") in options_of
    off = spark_cluster.spark_spec(settings.model_copy(update={"spark_class_archive": False}))
    assert spark_cluster.daemon_env({}, off)["SPARK_CONF_DIR"] == str(CONF_DIR)
    assert spark_cluster.daemon_env({}, off)["SPARK_DAEMON_JAVA_OPTS"] == QUICK_JIT_OPTIONS


def test_down_stops_workers_server_cluster_s3_and_the_database_last():
    keys = [
        "postgres",
        "s3",
        "spark-master",
        "spark-worker-2",
        "server",
        "spark-connect",
        "worker-gpu-pool",
        "spark-worker-1",
        "worker-cpu-pool",
    ]
    assert sorted(keys, key=engines.stop_order) == [
        "worker-cpu-pool",
        "worker-gpu-pool",
        "server",
        "spark-connect",
        "spark-worker-1",
        "spark-worker-2",
        "spark-master",
        "s3",
        "postgres",
    ]


def test_status_names_the_database_and_where_spark_runs(tmp_path):
    lines = engines.status_lines(engines.sqlite_info(tmp_path), None)
    assert lines[0] == f"database SQLite {tmp_path / 'prefect' / 'prefect.db'}"
    assert "local[*]" in lines[1]
    endpoints = SparkEndpoints(
        master_url="spark://127.0.0.1:1",
        master_ui="http://127.0.0.1:1",  # nothing listens there
        remote="sc://127.0.0.1:2",
        app_ui="http://127.0.0.1:3",
        workers=2,
    )
    lines = engines.status_lines(None, endpoints)
    assert lines[1] == "Spark master spark://127.0.0.1:1 (UI http://127.0.0.1:1): NOT ANSWERING"
    assert "sc://127.0.0.1:2" in engines.spark_summary(endpoints)
