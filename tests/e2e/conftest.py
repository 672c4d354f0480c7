"""Fixtures of the end-to-end tests."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest


@pytest.fixture
def stack_dir():
    """The stack's folder, where PostgreSQL's own user may pass (pytest's tmp is 0700)."""
    base = Path(tempfile.mkdtemp(prefix="hf-stack-"))
    os.chmod(base, 0o711)
    yield base / "stack"
    shutil.rmtree(base, ignore_errors=True)
