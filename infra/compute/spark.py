"""The SparkSession factory: local[*] by default, quiet logs, Arrow on, UTC, sane memory."""

from __future__ import annotations

import logging
import os
import shutil
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from infra.compute.jvm_archive import ClassSharing, class_sharing, conf_dir
from infra.compute.spark_connect import default_parallelism, runs_on_cluster
from infra.errors import HybridflowInputError
from infra.settings import HybridflowSettings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

CONF_DIR = Path(__file__).parent / "conf"
SessionProvider = Callable[[], "SparkSession"]
"""A session started only when called: for stages that need Spark only for some inputs."""
log = logging.getLogger(__name__)

# A local driver's JVM options when the settings leave them open. The quick JIT tier (C1 only)
# costs less CPU on small inputs, where compiling with C2 never pays back; from about 5M input
# rows the full tiered JIT wins (measured on 2 cores: a tie at 4.26M events; at 29.9M validate
# 236 -> 129-174 s and features 160 -> 86-90 s). One GC thread either way: the cores are the stages'.
QUICK_JIT_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
FULL_JIT_OPTIONS = "-XX:+UseSerialGC"
FULL_JIT_FROM_ROWS = 5_000_000


def check_java() -> None:
    """Fail early, with an install hint, when no Java runtime is on PATH."""
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        raise HybridflowInputError(
            "Spark needs Java 17 or 21 and none was found: install it "
            "(Debian/Ubuntu: apt-get install openjdk-17-jre-headless) or set JAVA_HOME"
        )


def local_java_options(settings: HybridflowSettings, input_rows: int | None = None) -> str:
    """A local driver's JVM options: the setting when given, else by ``input_rows`` (the
    input's row count or estimate; None = unknown, the quick tier)."""
    if settings.spark_local_java_options is not None:
        return settings.spark_local_java_options
    if input_rows is not None and input_rows >= FULL_JIT_FROM_ROWS:
        return FULL_JIT_OPTIONS
    return QUICK_JIT_OPTIONS


def spark_conf_for(settings: HybridflowSettings, input_rows: int | None = None) -> dict[str, str]:
    """The spark.* settings hybridflow applies for an input of about ``input_rows`` rows (None:
    unknown); user ``spark_conf`` entries win."""
    conf = {
        "spark.master": settings.spark_master,
        "spark.app.name": "hybridflow",
        "spark.driver.memory": settings.spark_driver_memory,
        "spark.executor.memory": settings.spark_executor_memory,
        "spark.sql.shuffle.partitions": str(settings.spark_shuffle_partitions),
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.sql.execution.arrow.maxRecordsPerBatch": str(settings.spark_arrow_batch_size),
        "spark.sql.adaptive.enabled": "true",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.sql.parquet.compression.codec": "snappy",
        "spark.python.worker.reuse": "true",
    }
    if not is_local_master(settings.spark_master):
        # A cluster's executors must reach the driver: bind where Spark picks, not loopback.
        conf.pop("spark.driver.host")
        conf.pop("spark.driver.bindAddress")
    elif java_options := local_java_options(settings, input_rows):
        conf["spark.driver.extraJavaOptions"] = java_options
    conf.update(settings.spark_conf)
    return conf


def is_local_master(master: str) -> bool:
    """True for ``local``, ``local[N]``, ``local[*]`` and ``local-cluster[...]``."""
    return master.strip().startswith("local")


def get_spark(
    settings: HybridflowSettings,
    input_rows: int | None = None,
    *,
    record_class_archive: Path | None = None,
) -> SparkSession:
    """The process's SparkSession, created on first use (2-11 s) and reused afterwards; a Spark
    Connect client session when ``spark_remote`` is set (:mod:`infra.compute.spark_connect`).
    ``input_rows`` sizes a new local driver's JVM (:func:`local_java_options`); a driver JVM
    started here (local or client mode) maps the installation's class archive when there is one (:mod:`infra.compute.jvm_archive`), or
    records one at ``record_class_archive``."""
    if settings.spark_remote:  # a thin client: no JVM here, no Java needed
        from infra.compute.spark_connect import connect_session

        return connect_session(settings, spark_conf_for(settings))
    check_java()
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    conf = spark_conf_for(settings, input_rows)
    sharing = _class_sharing(settings, record_class_archive)
    if sharing is not None:
        os.environ["SPARK_CONF_DIR"] = str(sharing.conf_dir)
        java_options = f"{conf.get('spark.driver.extraJavaOptions', '')} {sharing.java_options}"
        conf["spark.driver.extraJavaOptions"] = java_options.strip()
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("SPARK_CONF_DIR", str(CONF_DIR))
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("PYARROW_IGNORE_TIMEZONE", "1")
    builder = SparkSession.builder
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


class SparkOnDemand:
    """The process's SparkSession for ``settings``, started at the first call: what the flows
    hand stages that need Spark only for some inputs. Says without starting it whether it is
    a local driver, how many cores that has, and the conf it gets."""

    def __init__(self, settings: HybridflowSettings, input_rows: int | None = None) -> None:
        self.settings = settings
        self.input_rows = input_rows

    def __call__(self) -> SparkSession:
        return get_spark(self.settings, self.input_rows)

    def local_cores(self) -> int | None:
        """The cores of the local driver it starts; None for a cluster or Spark Connect."""
        master = self.settings.spark_master.strip()
        if self.settings.spark_remote or not is_local_master(master):
            return None
        if master == "local":
            return 1
        cores = master.removeprefix("local[").split("]")[0].split(",")[0]
        if master.startswith("local-cluster") or not (cores == "*" or cores.isdigit()):
            return None
        return (os.cpu_count() or 1) if cores == "*" else int(cores)

    def conf_value(self, key: str, default: str) -> str:
        """``key`` of the session's conf, as it is or would be started."""
        return spark_conf_for(self.settings, self.input_rows).get(key, default)


def session_of(spark: SparkSession | SessionProvider) -> SparkSession:
    """The session given, or the one ``spark`` provides (started now, when it must be)."""
    return spark() if callable(spark) else spark


def local_cores(spark: SparkSession | SessionProvider) -> int | None:
    """The cores of a local driver (its default parallelism); None where executors are other
    processes. A :class:`SparkOnDemand` answers without starting its session."""
    if isinstance(spark, SparkOnDemand):
        return spark.local_cores()
    session = session_of(spark)
    return None if runs_on_cluster(session) else default_parallelism(session)


def conf_value(spark: SparkSession | SessionProvider, key: str, default: str) -> str:
    """``key`` of the session's conf; a :class:`SparkOnDemand` answers without starting."""
    if isinstance(spark, SparkOnDemand):
        return spark.conf_value(key, default)
    return str(session_of(spark).conf.get(key, default))


def _class_sharing(settings: HybridflowSettings, record_to: Path | None) -> ClassSharing | None:
    """The class archive's set-up for a driver JVM this process starts (local, or a cluster's
    client-mode driver: Spark's launcher gives both the same class path), unless it is switched
    off or the user chose a ``SPARK_CONF_DIR`` (the archive's class path would not match)."""
    if not settings.spark_class_archive:
        return None
    folder = settings.class_archive_dir()
    ours = str(conf_dir(folder))
    if os.environ.get("SPARK_CONF_DIR", ours) != ours:
        return None
    return class_sharing(folder, CONF_DIR / "log4j2.properties", record_to)


def start_spark_in_background(
    settings: HybridflowSettings, input_rows: int | None = None
) -> threading.Thread:
    """Start the process's SparkSession on a daemon thread, so that the JVM boots while the
    caller does something else (``hybridflow run``: while Prefect starts its temporary API);
    :func:`get_spark` later returns that session (waiting for it if it is still starting).
    A failure here is only logged: the stage's own :func:`get_spark` reports it."""

    def start() -> None:
        try:
            get_spark(settings, input_rows)
        except Exception as exc:  # reported again, properly, by the stage that needs Spark
            log.debug("background Spark start failed: %s", exc)

    thread = threading.Thread(target=start, name="spark-start", daemon=True)
    thread.start()
    return thread
