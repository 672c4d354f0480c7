"""Prefect's SQLite database for the CLI's temporary API, seeded from an empty migrated copy.

On a ``PREFECT_HOME`` without a database, the temporary API's first start runs all of Prefect's
migrations: 8.4-9.4 s until it answers on a 2-core box, against 3.3-3.6 s when the database
exists. That is what the first run on a fresh machine pays, and so does every test that gives
the CLI a home of its own. ``make install`` records an empty, migrated database once per Prefect
version (``python -m infra.prefect_runtime.database``, beside the JVM class archive in the venv). Before the
temporary API starts, :func:`seed_database` copies it to where Prefect's SQLite database will be,
if no database is there yet; the first start then takes 4.2-4.7 s. Prefect still checks
the migrations at start-up. Other database URLs (PostgreSQL, in-memory) are left alone.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import shutil
import sqlite3
import sys
import tempfile
from pathlib import Path

SQLITE_PREFIX = "sqlite+aiosqlite:///"
TEMPLATE_DIR = Path(sys.prefix) / "var" / "hybridflow" / "prefect"


def template_path(folder: Path = TEMPLATE_DIR) -> Path:
    """Where the empty database of the installed Prefect version lives."""
    return folder / f"empty-{importlib.metadata.version('prefect')}.db"


def sqlite_file(connection_url: str) -> Path | None:
    """The file of a SQLite connection URL; None for other databases and in-memory SQLite."""
    if not connection_url.startswith(SQLITE_PREFIX):
        return None
    path = connection_url.removeprefix(SQLITE_PREFIX)
    if not path or path.startswith(":memory:") or "?" in path or "mode=memory" in path:
        return None
    return Path(path)


def configured_sqlite_file() -> Path | None:
    """The SQLite file a Prefect server started with this process's environment (and the
    profile it names) would open, if any."""
    from prefect.settings import Settings

    url = Settings().server.database.connection_url
    return sqlite_file(url.get_secret_value()) if url is not None else None


def seed_database(target: Path | None, template: Path) -> bool:
    """Copy ``template`` to ``target`` when there is no database there yet (no file, no WAL or
    shared-memory file of an earlier one); True when it did. The copy appears at once or not at
    all, and never replaces a database another process created meanwhile."""
    if target is None or not template.is_file():
        return False
    if any(Path(f"{target}{suffix}").exists() for suffix in ("", "-wal", "-shm", "-journal")):
        return False
    partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(template, partial)
        os.link(partial, target)  # fails if the database appeared meanwhile
        return True
    except OSError:  # that, or a home it cannot write: the server migrates (or says why not)
        return False
    finally:
        with contextlib.suppress(OSError):
            partial.unlink(missing_ok=True)


def record_template(template: Path) -> Path:
    """Start the temporary API once on an empty home so that Prefect creates and migrates its
    database, then write a compact standalone copy of it to ``template`` (atomically)."""
    from infra.prefect_runtime.api import TemporaryApi, server_env

    with tempfile.TemporaryDirectory(prefix="hybridflow-prefect-db-") as home:
        database = Path(home) / "prefect.db"
        env = server_env() | {
            "PREFECT_HOME": home,
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "PREFECT_API_DATABASE_CONNECTION_URL": f"{SQLITE_PREFIX}{database}",
        }
        env.pop("PREFECT_SERVER_DATABASE_CONNECTION_URL", None)
        api = TemporaryApi(env)
        try:
            api.wait_ready(180.0)
        finally:
            api.stop()
        template.parent.mkdir(parents=True, exist_ok=True)
        partial = template.with_name(f".{template.name}.partial")
        partial.unlink(missing_ok=True)
        with sqlite3.connect(database) as source:  # VACUUM INTO folds the WAL in
            source.execute("VACUUM INTO ?", (str(partial),))
        source.close()
        os.replace(partial, template)
    return template


if __name__ == "__main__":
    existing = template_path()
    if existing.is_file() and "--force" not in sys.argv[1:]:
        print(existing)
    else:
        print(record_template(existing))
