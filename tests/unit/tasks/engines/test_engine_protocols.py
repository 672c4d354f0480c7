"""Each CPU stage's work sits behind a small protocol (tasks/engines/<protocol>.py) that every
engine implements in its own folder (tasks/engines/in_process/, tasks/engines/spark/); the
runners call the implementation chosen once and hold no engine code themselves."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from tasks.engines.drift_aggregator import DriftAggregator
from tasks.engines.feature_frame import FeatureFrame
from tasks.engines.in_process.drift import InProcessDriftAggregator
from tasks.engines.in_process.features import InProcessFeatureFrame
from tasks.engines.in_process.scoring import InProcessScorer
from tasks.engines.in_process.snapshot import InProcessSnapshotBuilder
from tasks.engines.in_process.validate import InProcessValidator
from tasks.engines.scorer import Scorer
from tasks.engines.snapshot_builder import SnapshotBuilder
from tasks.engines.spark.drift import SparkDriftAggregator
from tasks.engines.spark.features import SparkFeatureFrame
from tasks.engines.spark.features_per_bucket import BucketFeatureFrame
from tasks.engines.spark.scoring import SparkScorer
from tasks.engines.spark.snapshot import SparkSnapshotBuilder
from tasks.engines.spark.validate import SparkValidator
from tasks.engines.validator import Validator

ROOT = Path(__file__).resolve().parents[4]
IMPLEMENTATIONS = {
    Validator: (InProcessValidator, SparkValidator),
    FeatureFrame: (InProcessFeatureFrame, SparkFeatureFrame, BucketFeatureFrame),
    SnapshotBuilder: (InProcessSnapshotBuilder, SparkSnapshotBuilder),
    DriftAggregator: (InProcessDriftAggregator, SparkDriftAggregator),
    Scorer: (InProcessScorer, SparkScorer),
}
CPU_RUNNERS = ("validate", "features", "preprocess", "batch_inference", "drift")
# what an engine's implementation imports, and a runner must not: it calls a protocol
ENGINE_LIBRARIES = (
    "duckdb",
    "numpy",
    "py4j",
    "pyarrow.compute",
    "pyspark.sql.functions",
    "pyspark.sql.types",
    "pyspark.sql.DataFrame",
    "pyspark.Accumulator",
)


def _methods(protocol: type) -> dict[str, inspect.Signature]:
    return {
        name: inspect.signature(member)
        for name, member in vars(protocol).items()
        if callable(member) and not name.startswith("_")
    }


@pytest.mark.parametrize(
    ("protocol", "implementation"),
    [(p, i) for p, impls in IMPLEMENTATIONS.items() for i in impls],
    ids=lambda c: c.__name__,
)
def test_each_engine_implements_the_stage_protocol(protocol, implementation):
    """Same methods, same parameter names in the same order (the runner calls them by name)."""
    for name, signature in _methods(protocol).items():
        assert hasattr(implementation, name), f"{implementation.__name__} lacks {name}"
        theirs = inspect.signature(getattr(implementation, name))
        assert list(theirs.parameters) == list(signature.parameters), (implementation, name)


def test_the_engines_implementations_live_in_one_folder_per_engine():
    for implementations in IMPLEMENTATIONS.values():
        folders = {i.__module__.split(".")[2] for i in implementations}
        assert folders == {"in_process", "spark"}, implementations


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}
    return found


@pytest.mark.parametrize("runner", CPU_RUNNERS)
def test_a_cpu_runner_holds_no_engine_code(runner):
    imported = _imports(ROOT / "tasks" / "stages" / f"{runner}.py")
    assert not imported & set(ENGINE_LIBRARIES), sorted(imported & set(ENGINE_LIBRARIES))


@pytest.mark.parametrize("runner", CPU_RUNNERS)
def test_a_cpu_runner_names_no_engine_only_the_registry(runner):
    """Adding an engine adds its folder and its lines in tasks/engines/registry.py: no runner
    imports an engine's implementations."""
    imported = _imports(ROOT / "tasks" / "stages" / f"{runner}.py")
    named = {
        m for m in imported if m.startswith(("tasks.engines.in_process", "tasks.engines.spark"))
    }
    assert not named, sorted(named)
    assert "tasks.engines.registry" in imported


@pytest.mark.parametrize("runner", CPU_RUNNERS)
def test_a_cpu_runner_asks_the_engine_choice_in_one_place(runner):
    tree = ast.parse((ROOT / "tasks" / "stages" / f"{runner}.py").read_text())
    calls = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "choose_engine"
    ]
    assert len(calls) == 1, runner
