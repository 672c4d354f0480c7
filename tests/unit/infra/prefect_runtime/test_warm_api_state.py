"""The warm Prefect API's bookkeeping (infra.prefect_runtime.warm_api, infra.prefect_runtime.warm_server) on a folder: leases
of dead commands do not count, a live lease keeps the server, an idle one forgets its record,
and a record from another Prefect version is not reused. No server and no signal here."""

from __future__ import annotations

import os
import sys
import time

from infra.prefect_runtime.warm_api import (
    WarmApiRecord,
    identity,
    live_leases,
    read_record,
    take_lease,
    why_not_reuse,
    write_record,
)
from infra.prefect_runtime.warm_server import Activity, should_stop
from infra.stack.processes import start_ticks


def record(folder, pid: int, **changes) -> WarmApiRecord:
    fields = {
        "pid": pid,
        "start_ticks": start_ticks(pid),
        "port": 9,
        "prefect_version": "3.9.1",
        "python": sys.executable,
        "database": "x",
        "started_at": time.time(),
        "idle_seconds": 1.0,
        "log_file": str(folder / "api.log"),
    }
    return WarmApiRecord(**(fields | changes))


def test_a_dead_commands_lease_does_not_count_and_is_removed(tmp_path):
    take_lease(tmp_path, server_pid=42)
    dead = tmp_path / "users" / str(os.getpid() + 1_000_000)
    dead.write_text("1 42")
    reused = tmp_path / "users" / "1"
    reused.write_text("999999999 42")  # PID 1 runs, but it started at another time
    assert live_leases(tmp_path) == [os.getpid()]
    assert live_leases(tmp_path, server_pid=42) == [os.getpid()]
    assert live_leases(tmp_path, server_pid=43) == [], "a lease holds its own server only"
    assert not dead.exists() and not reused.exists()


def test_an_idle_server_without_leases_stops_and_forgets_its_record(tmp_path):
    me = os.getpid()
    write_record(tmp_path, record(tmp_path, me))
    activity = Activity()
    assert not should_stop(tmp_path, activity, idle_seconds=3600, pid=me), "recently used"
    take_lease(tmp_path, server_pid=me + 1)
    activity.last -= 7200
    assert should_stop(tmp_path, activity, idle_seconds=3600, pid=me), "not a lease on it"
    write_record(tmp_path, record(tmp_path, me))
    take_lease(tmp_path, server_pid=me)
    assert not should_stop(tmp_path, activity, idle_seconds=3600, pid=me), "a command holds it"
    assert read_record(tmp_path) is not None
    (tmp_path / "users" / str(me)).unlink()
    assert should_stop(tmp_path, activity, idle_seconds=3600, pid=me)
    assert read_record(tmp_path) is None


def test_a_server_the_record_no_longer_names_stops_and_leaves_the_record(tmp_path):
    write_record(tmp_path, record(tmp_path, os.getpid()))
    assert should_stop(tmp_path, Activity(), idle_seconds=3600, pid=os.getpid() + 1_000_000)
    assert read_record(tmp_path).pid == os.getpid(), "the newer server's record is kept"


def test_a_server_of_another_prefect_version_or_database_is_not_reused(tmp_path):
    wanted = identity()
    alive = record(tmp_path, os.getpid(), **wanted)
    other_version = alive.model_copy(update={"prefect_version": "2.0.0"})
    assert "prefect version" in why_not_reuse(other_version, wanted, 120, tmp_path)
    other_db = alive.model_copy(update={"database": "0" * 16})
    assert "database" in why_not_reuse(other_db, wanted, 120, tmp_path)
    gone = alive.model_copy(update={"start_ticks": 1})
    assert why_not_reuse(gone, wanted, 120, tmp_path) == "its process is gone"
