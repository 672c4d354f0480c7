"""A stage's cached output is keyed by the source of the code that computes it: every
``tasks.data`` module a cached stage reaches through its imports must be in its code list, or a
change to that module would reuse outputs computed by the old code."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

from infra.fingerprint import code_modules

PROJECT = ("tasks.", "infra.")


def _imports(module: str) -> set[str]:
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin, module
    tree = ast.parse(Path(spec.origin).read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {m for m in found if m.startswith(PROJECT)}


def _reached(start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        todo.extend(_imports(module) - seen)
    return seen


@pytest.mark.parametrize(
    "stage, code",
    [
        ("tasks.stages.validate", code_modules("tasks.stages.validate")),
        ("tasks.stages.features", code_modules("tasks.stages.features")),
        ("tasks.stages.preprocess", code_modules("tasks.stages.preprocess")),
    ],
)
def test_every_data_module_a_stage_reaches_is_in_its_code_fingerprint(stage, code):
    data_modules = {m for m in _reached(stage) if m.startswith("tasks.data.")}
    assert data_modules, stage
    assert data_modules <= set(code), f"{stage} lacks {sorted(data_modules - set(code))}"
