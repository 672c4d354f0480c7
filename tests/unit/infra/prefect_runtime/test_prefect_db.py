"""Seeding Prefect's SQLite database from the installation's empty copy: which URLs are SQLite
files, and a copy only where no database is, never over one that appeared meanwhile."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import infra.prefect_runtime.database as prefect_db
from infra.prefect_runtime.database import seed_database, sqlite_file


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("sqlite+aiosqlite:////home/me/.prefect/prefect.db", Path("/home/me/.prefect/prefect.db")),
        ("sqlite+aiosqlite:///:memory:", None),
        ("sqlite+aiosqlite:///file:db?mode=memory&cache=shared&uri=true", None),
        ("postgresql+asyncpg://prefect:secret@127.0.0.1:5432/prefect", None),
    ],
)
def test_only_sqlite_files_are_seeded(url, expected):
    assert sqlite_file(url) == expected


@pytest.fixture
def template(tmp_path) -> Path:
    path = tmp_path / "empty-3.9.1.db"
    path.write_bytes(b"an empty migrated database")
    return path


def test_a_home_without_a_database_gets_the_template(tmp_path, template):
    target = tmp_path / "home" / "prefect.db"
    assert seed_database(target, template)
    assert target.read_bytes() == template.read_bytes()
    assert [p.name for p in target.parent.iterdir()] == ["prefect.db"], "no partial file left"


@pytest.mark.parametrize("existing", ["prefect.db", "prefect.db-wal", "prefect.db-shm"])
def test_an_existing_database_or_its_leftovers_are_never_replaced(tmp_path, template, existing):
    home = tmp_path / "home"
    home.mkdir()
    (home / existing).write_bytes(b"runs of last week")
    target = home / "prefect.db"
    assert not seed_database(target, template)
    assert (home / existing).read_bytes() == b"runs of last week"
    assert existing == "prefect.db" or not target.exists()


def test_a_database_created_while_copying_wins(tmp_path, template, monkeypatch):
    target = tmp_path / "home" / "prefect.db"
    real_copy = shutil.copyfile

    def copy_while_another_server_starts(src, dst):
        real_copy(src, dst)
        target.write_bytes(b"another process's database")

    monkeypatch.setattr(prefect_db.shutil, "copyfile", copy_while_another_server_starts)
    assert not seed_database(target, template)
    assert target.read_bytes() == b"another process's database"
    assert [p.name for p in target.parent.iterdir()] == ["prefect.db"]


def test_nothing_happens_without_a_template_or_a_file(tmp_path):
    assert not seed_database(tmp_path / "prefect.db", tmp_path / "missing.db")
    assert not seed_database(None, tmp_path / "missing.db")
    assert not (tmp_path / "prefect.db").exists()


def test_a_home_it_cannot_create_is_left_to_the_server(tmp_path, template):
    """PREFECT_HOME names a file: no copy, no exception; the server reports the problem."""
    not_a_folder = tmp_path / "home"
    not_a_folder.write_text("a file, not a folder")
    assert not seed_database(not_a_folder / "prefect.db", template)
    assert not_a_folder.read_text() == "a file, not a folder"
