"""Fixtures of the end-to-end tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def stack_dir(passable_tmp):
    """The stack's folder, where PostgreSQL's own user may pass."""
    return passable_tmp / "stack"
