"""Settings are passed down: below flows/ no code reads the environment's settings
(``get_settings()``) except where a process starts or a process-level default is taken, each
listed here with its reason. A new read below flows/ fails this test; a flow passes the run's
settings (or the typed values they give) to the runner instead."""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# file -> get_settings() calls allowed there, and why
ALLOWED = {
    # the torchrun entry point: the settings of the process torchrun started (its launcher's
    # environment), read once in main() and passed down from there
    "tasks/stages/train_process.py": 1,
    # left (issue 31): process-level defaults read where no flow is around: DuckDB's memory
    # limit and spill folder (also in Spark's Python workers), the cluster's shared-filesystem
    # check, the S3 store's retries (open_store runs in executors too)
    "infra/compute/duckdb_session.py": 3,
    "infra/compute/spark_io.py": 1,
    "infra/storage/store.py": 1,
    # its definition's module: settings_defaults() and friends
    "infra/settings.py": 0,
}


def _reads(path: Path) -> int:
    tree = ast.parse(path.read_text())
    return sum(
        1
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and (getattr(node.func, "id", None) or getattr(node.func, "attr", None)) == "get_settings"
    )


def test_no_settings_read_below_flows_but_the_listed_ones():
    found = Counter(
        {
            p.relative_to(ROOT).as_posix(): n
            for folder in ("tasks", "infra")
            for p in sorted((ROOT / folder).rglob("*.py"))
            if (n := _reads(p))
        }
    )
    allowed = Counter({f: n for f, n in ALLOWED.items() if n})
    assert found == allowed, (
        f"get_settings() below flows/ (pass the run's settings down from the flow instead): "
        f"new {dict(found - allowed)}, gone {dict(allowed - found)}"
    )


def test_the_runners_defaults_are_the_declared_ones_not_the_environment(monkeypatch):
    """A runner called without a flow takes the declared defaults, whatever the environment
    says; the flow passes the run's settings explicitly."""
    from infra.settings import in_process_rows_or_default, settings_defaults

    monkeypatch.setenv("HYBRIDFLOW_IN_PROCESS_ROWS", "7")
    monkeypatch.setenv("HYBRIDFLOW_AS_OF_GRACE_DAYS", "30")
    assert in_process_rows_or_default(None) == settings_defaults().in_process_rows != 7
    assert in_process_rows_or_default(3) == 3
    assert settings_defaults().as_of_grace_days != 30
