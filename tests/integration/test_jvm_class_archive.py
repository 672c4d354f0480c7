"""Local drivers start from the installation's JVM class archive, in a fresh process each; a
broken archive is refused and the driver runs without it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from infra.compute.jvm_archive import archive_path
from infra.settings import HybridflowSettings

pytestmark = pytest.mark.integration

START = textwrap.dedent(
    """
    import os
    from infra.settings import get_settings
    from infra.compute.spark import get_spark

    spark = get_spark(get_settings())
    assert spark.range(1000).selectExpr("sum(id)").first()[0] == 499500
    pid = spark.sparkContext._gateway.proc.pid
    print("CMDLINE", open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\\0", b" ").decode())
    print("CONF_DIR", os.environ["SPARK_CONF_DIR"])
    """
)


def _python(code: str, folder) -> subprocess.CompletedProcess:
    env = dict(os.environ, HYBRIDFLOW_SPARK_CLASS_ARCHIVE_DIR=str(folder))
    env.pop("SPARK_CONF_DIR", None)
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )


def _line(out: str, tag: str) -> str:
    return next(line for line in out.splitlines() if line.startswith(tag + " "))[len(tag) + 1 :]


@pytest.mark.slow(reason="starts a new Spark driver (JVM) in a child process")
def test_the_installations_archive_is_mapped_by_a_new_driver():
    """``make install`` recorded it (``hybridflow jvm-archive``; install fails if that does): a
    new local driver starts from it, with the archive's class path, and the JVM accepts it."""
    folder = HybridflowSettings(_env_file=None).class_archive_dir()
    archive = archive_path(folder)
    assert archive.exists(), f"no JVM class archive at {archive}: run `hybridflow jvm-archive`"
    assert list(folder.glob("*.partial")) == [], "a recording left its partial file behind"

    started = _python(START, folder)
    assert started.returncode == 0, started.stderr[-3000:]
    assert f"-XX:SharedArchiveFile={archive}" in _line(started.stdout, "CMDLINE")
    assert _line(started.stdout, "CONF_DIR") == str(folder / "conf")
    assert "Unable to use shared archive" not in started.stdout + started.stderr


@pytest.mark.slow(
    reason="starts new Spark drivers (JVMs) in child processes, with a broken archive and without one"
)
def test_a_broken_archive_is_refused_and_the_driver_runs_without_it(tmp_path):
    archive_path(tmp_path).write_bytes(b"not an archive" * 1000)
    started = _python(START, tmp_path)
    assert started.returncode == 0, started.stderr[-3000:]
    assert f"-XX:SharedArchiveFile={archive_path(tmp_path)}" in _line(started.stdout, "CMDLINE")


@pytest.mark.slow(reason="starts a Spark master (a JVM) with a broken class archive")
def test_the_clusters_jvms_start_with_a_broken_archive(tmp_path):
    """The stack's cluster maps the same archive (``hybridflow up``, through
    ``SPARK_DAEMON_JAVA_OPTS`` and the Connect server's options): one that is broken is refused
    and its daemons start without it."""
    from infra.stack.processes import launcher_into
    from infra.stack.spark_cluster import (
        SparkClusterSpec,
        master_status,
        start_standalone,
        stop_cluster,
    )

    folder = tmp_path / "jvm"
    folder.mkdir()
    archive_path(folder).write_bytes(b"not an archive" * 1000)
    spec = SparkClusterSpec(workers=0, class_archive_dir=folder)
    records: dict = {}
    try:
        launch = launcher_into(records, tmp_path / "logs", tmp_path)
        _, master_ui = start_standalone(launch, tmp_path, spec, dict(os.environ))
        assert master_status(master_ui) is not None, "the master does not answer"
        command = open(f"/proc/{records['spark-master'].pid}/cmdline", "rb").read().split(b"\0")
        assert f"-XX:SharedArchiveFile={archive_path(folder)}".encode() in command
    finally:
        stop_cluster(records)
