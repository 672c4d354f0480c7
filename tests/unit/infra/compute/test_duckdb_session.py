"""The in-process DuckDB connections hold at most ``in_process_memory`` (default a share of the
machine's memory) and spill beyond it into a private folder under the work dir, which goes away
with the connection; running out of the limit is an error that names the settings."""

from __future__ import annotations

import duckdb
import pydantic
import pytest

from infra.compute.duckdb_session import (
    DEFAULT_MEMORY_SHARE,
    default_memory_limit,
    duckdb_connection,
    machine_memory_bytes,
    memory_bounded,
)
from infra.errors import HybridflowInputError
from infra.settings import HybridflowSettings, get_settings


@pytest.fixture
def settings_env(monkeypatch, tmp_path):
    monkeypatch.setenv("HYBRIDFLOW_WORK_DIR", str(tmp_path / "work"))
    monkeypatch.delenv("HYBRIDFLOW_IN_PROCESS_MEMORY", raising=False)
    get_settings.cache_clear()
    yield monkeypatch
    get_settings.cache_clear()


def _limit(connection: duckdb.DuckDBPyConnection) -> str:
    return connection.execute("SELECT current_setting('memory_limit')").fetchall()[0][0]


def test_the_setting_bounds_memory_and_spills_into_a_private_folder(settings_env, tmp_path):
    settings_env.setenv("HYBRIDFLOW_IN_PROCESS_MEMORY", "64MiB")
    get_settings.cache_clear()
    spill_root = tmp_path / "work" / "spill"
    connection = duckdb_connection()
    try:
        assert _limit(connection) == "64.0 MiB"
        # ~230 MB of distinct strings: more than the limit, so the sort spills
        connection.execute(
            "CREATE TEMP TABLE big AS SELECT range AS i, md5(range::VARCHAR) || md5((range + 1)"
            "::VARCHAR) AS s FROM range(3000000)"
        )
        top = connection.execute("SELECT i FROM big ORDER BY s DESC LIMIT 1").fetchall()
        expected = duckdb.sql(
            "SELECT range FROM range(3000000) "
            "ORDER BY md5(range::VARCHAR) || md5((range + 1)::VARCHAR) DESC LIMIT 1"
        ).fetchall()
        assert top == expected
        folders = list(spill_root.iterdir())
        assert len(folders) == 1 and folders[0].name.startswith("duckdb-")
        assert any(folders[0].iterdir())
    finally:
        connection.close()
    assert list(spill_root.iterdir()) == []


def test_unset_the_limit_is_a_share_of_the_machines_memory(settings_env):
    expected_mib = int(machine_memory_bytes() * DEFAULT_MEMORY_SHARE) >> 20
    assert default_memory_limit() == f"{expected_mib}MiB"
    connection = duckdb_connection()
    try:
        shown = _limit(connection)  # DuckDB shows e.g. "9.4 GiB"
        number, unit = shown.split()
        shown_mib = float(number) * {"MiB": 1, "GiB": 1024}[unit]
        assert shown_mib == pytest.approx(expected_mib, rel=0.01)
    finally:
        connection.close()
    assert 0 < machine_memory_bytes() < 1 << 50


def test_running_out_names_the_settings(settings_env):
    settings_env.setenv("HYBRIDFLOW_IN_PROCESS_MEMORY", "8MB")
    get_settings.cache_clear()
    connection = duckdb_connection()
    try:
        with pytest.raises(HybridflowInputError) as caught, memory_bounded("counting strings"):
            connection.execute(
                "SELECT count(DISTINCT md5(range::VARCHAR) || range) FROM range(5000000)"
            ).fetchall()
    finally:
        connection.close()
    message = str(caught.value)
    assert message.startswith("counting strings needs more memory")
    for named in ("8MB", "HYBRIDFLOW_IN_PROCESS_MEMORY", "HYBRIDFLOW_IN_PROCESS_ROWS"):
        assert named in message


def test_a_containers_memory_limit_lowers_the_machines(tmp_path):
    physical = machine_memory_bytes(cgroup_limits=())
    v2, v1, missing = tmp_path / "memory.max", tmp_path / "limit_in_bytes", tmp_path / "none"
    v2.write_text("max\n")
    v1.write_text(f"{physical * 4}\n")  # v1 writes a huge number for "no limit"
    assert machine_memory_bytes(cgroup_limits=(v2, v1, missing)) == physical
    v1.write_text(f"{2 << 30}\n")
    assert machine_memory_bytes(cgroup_limits=(v2, v1, missing)) == 2 << 30
    v2.write_text(f"{1 << 30}\n")
    assert machine_memory_bytes(cgroup_limits=(v2, v1)) == 1 << 30


@pytest.mark.parametrize("value", ["lots", "4", "4 gigabytes", "-1GB"])
def test_a_limit_duckdb_would_not_read_is_refused(value):
    with pytest.raises(pydantic.ValidationError, match="in_process_memory"):
        HybridflowSettings(in_process_memory=value)
