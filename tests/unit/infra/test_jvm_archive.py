"""The local driver's class-archive set-up: which options, which conf folder, when none."""

from __future__ import annotations

import pytest

from infra.jvm_archive import archive_path, class_sharing, conf_dir
from infra.settings import HybridflowSettings
from infra.spark import CONF_DIR, _class_sharing

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
    "env, master, enabled, expected",
    [
        ({}, "local[2]", True, True),
        ({}, "local[2]", False, False),
        ({}, "spark://10.0.0.5:7077", True, False),
        ({"SPARK_CONF_DIR": "/etc/spark/conf"}, "local[*]", True, False),
    ],
)
def test_only_local_drivers_with_our_conf_folder_use_it(
    monkeypatch, tmp_path, env, master, enabled, expected
):
    monkeypatch.delenv("SPARK_CONF_DIR", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    settings = HybridflowSettings(
        _env_file=None, spark_class_archive=enabled, spark_class_archive_dir=tmp_path
    )
    sharing = _class_sharing(settings, master, None)
    assert (sharing is not None) is expected
    if sharing is not None:
        assert sharing.conf_dir == conf_dir(tmp_path)


def test_the_default_folder_is_in_the_python_environment():
    import sys

    folder = HybridflowSettings(_env_file=None).class_archive_dir()
    assert folder.is_relative_to(sys.prefix)
