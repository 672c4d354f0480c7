"""Recording the JVM class archive and starting a local driver from it, each in a fresh process
(the archive is written when the JVM exits); a stale archive is refused and the run goes on."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from infra.jvm_archive import archive_path

pytestmark = pytest.mark.integration

RECORD = textwrap.dedent(
    """
    from infra.jvm_archive import record_archive
    from infra.settings import get_settings
    from infra.spark import get_spark

    settings = get_settings()
    path = record_archive(
        settings.class_archive_dir(),
        lambda partial: get_spark(settings, record_class_archive=partial),
        lambda spark: spark.range(1000).selectExpr("id % 7 AS k").groupBy("k").count().collect(),
    )
    print("RECORDED", path)
    """
)
START = textwrap.dedent(
    """
    import os
    from infra.settings import get_settings
    from infra.spark import get_spark

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


def test_a_recorded_archive_is_mapped_by_the_next_driver(tmp_path):
    recorded = _python(RECORD, tmp_path)
    assert recorded.returncode == 0, recorded.stderr[-3000:]
    archive = archive_path(tmp_path)
    assert _line(recorded.stdout, "RECORDED") == str(archive)
    assert archive.stat().st_size > 1 << 20
    assert list(tmp_path.glob("*.partial")) == [], "the partial file became the archive"
    assert "[cds" not in recorded.stdout + recorded.stderr, "recording is quiet"

    started = _python(START, tmp_path)
    assert started.returncode == 0, started.stderr[-3000:]
    assert f"-XX:SharedArchiveFile={archive}" in _line(started.stdout, "CMDLINE")
    assert _line(started.stdout, "CONF_DIR") == str(tmp_path / "conf")
    assert "Unable to use shared archive" not in started.stdout + started.stderr


def test_a_broken_archive_is_refused_and_the_driver_runs_without_it(tmp_path):
    archive_path(tmp_path).write_bytes(b"not an archive" * 1000)
    started = _python(START, tmp_path)
    assert started.returncode == 0, started.stderr[-3000:]
    assert f"-XX:SharedArchiveFile={archive_path(tmp_path)}" in _line(started.stdout, "CMDLINE")
