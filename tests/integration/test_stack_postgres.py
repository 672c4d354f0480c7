"""The stack's PostgreSQL from the machine's server binaries: password authentication on
loopback, the password nowhere but its file, and a second start that keeps the data."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from infra.stack import postgres
from infra.stack.processes import is_alive, launcher_into, stop

pytestmark = pytest.mark.integration


@pytest.fixture
def pg_dir(passable_tmp):
    """A data folder the ``postgres`` user can reach when we are root."""
    return passable_tmp / "postgres"


def _query(port: int, secret: str, sql: str):
    import asyncpg

    async def run():
        conn = await asyncpg.connect(
            host="127.0.0.1",
            port=port,
            user=postgres.ROLE,
            password=secret,
            database=postgres.DATABASE,
            timeout=10,
        )
        try:
            return await conn.fetch(sql)
        finally:
            await conn.close()

    return asyncio.run(run())


def test_postgres_keeps_its_data_and_its_password_to_itself(pg_dir):
    import asyncpg

    log = pg_dir.parent / "initdb.log"
    records: dict = {}
    launch = launcher_into(records, pg_dir.parent, Path.cwd())
    info = postgres.start(launch, pg_dir, dict(os.environ), log)
    record = records[postgres.KEY]
    try:
        secret = postgres.password(pg_dir)
        _query(info.port, secret, "CREATE TABLE kept (v int)")
        _query(info.port, secret, "INSERT INTO kept VALUES (42)")
        with pytest.raises(asyncpg.InvalidPasswordError):
            _query(info.port, "not-the-password", "SELECT 1")
        assert not any(secret in part for part in record.command)
        assert secret not in log.read_text() + Path(record.log_file).read_text()
        assert (pg_dir / "data" / "postmaster.pid").is_file()
    finally:
        assert stop(record, grace_s=20) == "stopped"
    assert not is_alive(record)

    info2 = postgres.start(launch, pg_dir, dict(os.environ), log, port=info.port)
    again = records[postgres.KEY]
    try:
        assert not postgres.initialize(pg_dir, log), "the data folder is reused"
        assert [r["v"] for r in _query(info2.port, secret, "SELECT v FROM kept")] == [42]
    finally:
        stop(again, grace_s=20)
