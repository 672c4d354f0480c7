"""One threshold decides what runs in the flow's process: the drift check follows the stages'
``HYBRIDFLOW_IN_PROCESS_ROWS`` unless its own setting is given."""

from __future__ import annotations

import pytest

from infra.settings import HybridflowSettings


@pytest.fixture
def clean_env(monkeypatch):
    for name in ("HYBRIDFLOW_IN_PROCESS_ROWS", "HYBRIDFLOW_DRIFT__IN_PROCESS_ROWS"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_the_drift_check_follows_the_stages_threshold(clean_env):
    assert HybridflowSettings().drift.in_process_rows == HybridflowSettings().in_process_rows
    clean_env.setenv("HYBRIDFLOW_IN_PROCESS_ROWS", "1234")
    settings = HybridflowSettings()
    assert settings.in_process_rows == 1234 and settings.drift.in_process_rows == 1234


def test_the_drift_checks_own_setting_wins(clean_env):
    clean_env.setenv("HYBRIDFLOW_IN_PROCESS_ROWS", "1234")
    clean_env.setenv("HYBRIDFLOW_DRIFT__IN_PROCESS_ROWS", "0")
    settings = HybridflowSettings()
    assert settings.in_process_rows == 1234 and settings.drift.in_process_rows == 0
