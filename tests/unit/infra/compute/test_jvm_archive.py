"""The local driver's class-archive set-up: which options, which conf folder, when none."""

from __future__ import annotations

import pytest

from infra.compute.jvm_archive import archive_path, class_sharing, conf_dir
from infra.compute.spark import CONF_DIR, _class_sharing
from infra.settings import HybridflowSettings

LOG4J = CONF_DIR / "log4j2.properties"


def test_an_archive_is_mapped_only_when_recorded(tmp_path):
    before = class_sharing(tmp_path, LOG4J)
    assert before.java_options == f"-Dlog4j.configurationFile=file:{LOG4J}"
    assert before.conf_dir == conf_dir(tmp_path) and list(before.conf_dir.iterdir()) == []

    archive_path(tmp_path).write_bytes(b"recorded")
    after = class_sharing(tmp_path, LOG4J)
    assert f"-XX:SharedArchiveFile={archive_path(tmp_path)}" in after.java_options.split()


def test_recording_writes_at_exit_quietly_and_maps_nothing(tmp_path):
    archive_path(tmp_path).write_bytes(b"an older one")
    partial = tmp_path / "x.partial"
    options = class_sharing(tmp_path, LOG4J, record_to=partial).java_options.split()
    assert f"-XX:ArchiveClassesAtExit={partial}" in options
    assert "-Xlog:cds=off" in options
    assert not any(o.startswith("-XX:SharedArchiveFile") for o in options)


def test_archives_differ_by_key(tmp_path):
    assert archive_path(tmp_path, "a") != archive_path(tmp_path, "b")


@pytest.mark.parametrize(
    "env, enabled, expected",
    [
        ({}, True, True),
        ({}, False, False),
        ({"SPARK_CONF_DIR": "/etc/spark/conf"}, True, False),
    ],
)
def test_only_drivers_with_our_conf_folder_use_it(monkeypatch, tmp_path, env, enabled, expected):
    """Local and client-mode drivers alike (Spark's launcher gives both the same class path)."""
    monkeypatch.delenv("SPARK_CONF_DIR", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    settings = HybridflowSettings(
        _env_file=None, spark_class_archive=enabled, spark_class_archive_dir=tmp_path
    )
    sharing = _class_sharing(settings, None)
    assert (sharing is not None) is expected
    if sharing is not None:
        assert sharing.conf_dir == conf_dir(tmp_path)


def test_the_default_folder_is_in_the_python_environment():
    import sys

    folder = HybridflowSettings(_env_file=None).class_archive_dir()
    assert folder.is_relative_to(sys.prefix)


class _Gateway:
    """What ``record_archive`` uses of a session: its gateway process, here a Python process
    that, like Spark's gateway JVM, writes the archive when its input ends."""

    def __init__(self, partial, writes: bool) -> None:
        import subprocess
        import sys

        write = f"open({str(partial)!r}, 'wb').write(b'classes')" if writes else "pass"
        code = f"import sys; sys.stdin.read(); {write}"
        self.proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE)
        self.stopped = False

    @property
    def sparkContext(self):  # noqa: N802 - the SparkSession attribute
        return type("Context", (), {"_gateway": self})()

    def stop(self) -> None:
        self.stopped = True


def test_the_partial_file_becomes_the_archive_after_the_gateway_exits(tmp_path):
    from infra.compute.jvm_archive import record_archive

    sessions = []
    path = record_archive(
        tmp_path,
        lambda partial: sessions.append(_Gateway(partial, writes=True)) or sessions[-1],
        lambda spark: None,
    )
    assert path == archive_path(tmp_path) and path.read_bytes() == b"classes"
    assert sessions[0].stopped and sessions[0].proc.returncode == 0
    assert [p.name for p in tmp_path.iterdir()] == [path.name]


@pytest.mark.parametrize("writes", [True, False])
def test_a_failed_recording_leaves_nothing_behind(tmp_path, writes):
    from infra.compute.jvm_archive import record_archive

    def broken_workload(spark) -> None:
        raise ValueError("workload broke")

    def no_archive_written(spark) -> None:
        return None

    workload = broken_workload if writes else no_archive_written
    expected = ValueError if writes else RuntimeError
    with pytest.raises(expected, match="workload broke|wrote no class archive"):
        record_archive(tmp_path, lambda partial: _Gateway(partial, writes=writes), workload)
    assert list(tmp_path.iterdir()) == [], "no archive, no partial file"
