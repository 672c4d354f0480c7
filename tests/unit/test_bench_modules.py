"""Every benchmark still imports and exposes ``main``: ``make bench`` is not part of the suite,
so a renamed or moved function would otherwise break it unnoticed."""

from __future__ import annotations

import importlib

import pytest

from bench.__main__ import discover


@pytest.mark.parametrize("name", discover([]))
def test_benchmark_module_imports_and_has_main(name):
    module = importlib.import_module(f"bench.{name}")
    assert callable(getattr(module, "main", None)), f"bench/{name}.py has no main(results_dir)"
