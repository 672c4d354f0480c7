"""Background imports for a later stage: done when finished, failures left to the real import."""

from __future__ import annotations

import sys

import infra.warm_imports as warm_imports
from infra.warm_imports import finish_warm_imports, start_warm_imports


def test_modules_are_imported_once_finished(monkeypatch):
    monkeypatch.setattr(warm_imports, "_thread", None)
    monkeypatch.delitem(sys.modules, "xml.dom.minidom", raising=False)
    start_warm_imports(["hybridflow_no_such_module", "xml.dom.minidom"])
    first = warm_imports._thread
    start_warm_imports(["hybridflow_no_such_module"])
    assert warm_imports._thread is first, "one thread per process"
    finish_warm_imports()
    assert "xml.dom.minidom" in sys.modules, "a failing module does not stop the others"
    assert not first.is_alive()


def test_finishing_without_a_start_returns(monkeypatch):
    monkeypatch.setattr(warm_imports, "_thread", None)
    finish_warm_imports()
