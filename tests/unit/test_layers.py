"""The layers point one way: the import-linter contracts in pyproject.toml hold for the tree, and
they do fail on a deliberately wrong import (infra reaching up into flows)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("cli", "flows", "tasks", "infra", "serving")
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _lint(cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"], cwd=cwd, capture_output=True, text=True, timeout=300
    )


def test_the_tree_keeps_every_contract():
    result = _lint(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_an_upward_import_breaks_the_layers(tmp_path):
    for package in PACKAGES:
        shutil.copytree(
            ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    with (tmp_path / "infra" / "layout.py").open("a") as f:
        f.write("\nfrom flows import dag  # noqa: E402,F401 - the violation under test\n")
    result = _lint(tmp_path)
    assert result.returncode != 0
    assert "BROKEN" in result.stdout and "infra.layout -> flows.dag" in result.stdout
