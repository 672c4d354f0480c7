"""One graph at run time: a stage's upstream results come from flows/dag.py only. Every runner
takes exactly the results its stage declares in ``reads`` (keyword arguments named after those
stages, typed as their results), and no flow or runner reads a stage manifest by name itself."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from flows.dag import CONTENDER, STAGES, TRAIN, Stage, load_flow, stage

ROOT = Path(__file__).resolve().parents[3]
RESULT_TYPES = {s.result.__name__: s.name for s in STAGES}
# the one reader of manifests by name, its definition, and the torchrun entry point given only a
# run id (its READS is pinned to the train stage's reads below)
MANIFEST_READERS = {"flows/dag.py", "tasks/reporting/records.py", "tasks/stages/train_process.py"}


def upstream_parameters(runner) -> dict[str, str]:
    """The runner's parameters typed as a stage's result (optionally ``| None``): parameter
    name -> that stage."""
    found = {}
    for name, parameter in inspect.signature(runner).parameters.items():
        typed = re.fullmatch(r"(\w+)( \| None)?", str(parameter.annotation))
        if typed and typed.group(1) in RESULT_TYPES:
            found[name] = RESULT_TYPES[typed.group(1)]
    return found


@pytest.mark.parametrize("declared", [*STAGES, CONTENDER], ids=lambda s: s.name)
def test_each_runner_takes_exactly_the_upstream_results_its_stage_declares(declared: Stage):
    assert declared.runner, declared
    runner = load_flow(declared.runner)
    taken = upstream_parameters(runner)
    assert taken == {name: name for name in declared.reads}, (
        f"{declared.runner} takes {taken}, the graph declares {declared.name} reads "
        f"{declared.reads}"
    )


def test_every_pipeline_stage_declares_its_typed_result():
    assert all(s.result.__name__.endswith("Result") for s in STAGES)


def test_a_runner_reading_an_undeclared_upstream_is_caught():
    def features_stage_reading_train(spark, store, validate: ValidateResult, train: TrainResult):  # noqa: F821
        """A runner that reads the train stage's result, which features does not declare."""

    taken = upstream_parameters(features_stage_reading_train)
    assert taken != {name: name for name in stage("features").reads}


def _python_files(*folders: str) -> list[Path]:
    return [p for folder in folders for p in sorted((ROOT / folder).rglob("*.py"))]


def test_no_flow_or_runner_reads_a_stage_manifest_by_name():
    offenders = []
    for path in _python_files("flows", "tasks/stages", "cli"):
        relative = path.relative_to(ROOT).as_posix()
        if relative in MANIFEST_READERS:
            continue
        text = path.read_text()
        if "read_stage_manifest(" in text:
            offenders.append(relative)
    assert offenders == [], f"read upstream results through flows.dag.upstream_results: {offenders}"


def test_the_training_process_reads_what_the_train_stage_declares():
    from tasks.stages.train_process import READS

    assert tuple(READS) == TRAIN.reads
    assert [m.__name__ for m in READS.values()] == [stage(n).result.__name__ for n in TRAIN.reads]


def test_every_read_and_after_names_an_earlier_stage():
    seen: set[str] = set()
    for declared in STAGES:
        assert set(declared.reads) | set(declared.after) <= seen, declared.name
        seen.add(declared.name)


# Runners the graph does not name as a Stage: the drift check (flows/drift.py runs it after a
# pipeline and before a refresh) and the torchrun entry point of the train unit.
RUNNERS_OUTSIDE_THE_GRAPH = {"drift.py", "train_process.py"}


def test_tasks_stages_holds_the_graphs_runners_only():
    """Engines, policy, reporting and plumbing live elsewhere (tasks/engines, tasks/policy,
    tasks/reporting, tasks/ml, infra): every module in tasks/stages is a runner."""
    runners = {s.runner.split(":")[0].rsplit("/", 1)[1] for s in [*STAGES, CONTENDER]}
    modules = {p.name for p in (ROOT / "tasks" / "stages").glob("*.py") if p.name != "__init__.py"}
    assert modules == runners | RUNNERS_OUTSIDE_THE_GRAPH
