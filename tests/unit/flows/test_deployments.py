"""prefect.yaml against the stage graph of flows/dag.py: every stage and dispatch unit has its
deployment(s) with the entrypoint and pool the graph declares, and both executors make the same
routing decisions."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import yaml

from flows.artifacts import progress_artifact_key
from flows.dag import (
    CONTENDER_UNIT,
    PIPELINE_UNITS,
    REFRESH_UNITS,
    STAGES,
    DispatchUnit,
    Stage,
    home_pools,
    load_flow,
    routed_stages,
    units_through,
)
from flows.executors import dispatch_mode, is_complete
from flows.pipeline import routed_device, stage_origins, unit_pools
from flows.refresh import refresh_flow
from infra.layout import stage_manifest_key
from infra.routing.planner import RoutingPlan
from infra.routing.pools import POOLS
from infra.routing.router import RoutingDecision, WorkloadKind

PREFECT_YAML = Path(__file__).resolve().parents[3] / "prefect.yaml"
OTHER_FLOWS = {
    "pipeline": "flows/pipeline.py:pipeline_flow",
    "model-refresh": "flows/refresh.py:refresh_flow",
}


@pytest.fixture(scope="module")
def deployments() -> dict[str, dict]:
    spec = yaml.safe_load(PREFECT_YAML.read_text())
    return {d["name"]: d for d in spec["deployments"]}


def _expected_deployments() -> dict[str, tuple[str, str]]:
    """name -> (entrypoint, pool), from the graph alone."""
    expected = {s.flow_name: (s.entrypoint, s.pool) for s in STAGES}
    for unit in (*PIPELINE_UNITS, CONTENDER_UNIT):
        for pool in POOLS:
            expected[unit.deployment_name(pool)] = (unit.entrypoint, pool)
    for pool in POOLS:
        expected[f"profile-on-{pool}"] = ("flows/profiling.py:profile_flow", pool)
    return expected


def test_prefect_yaml_declares_exactly_the_graphs_deployments(deployments):
    expected = _expected_deployments()
    for name, (entrypoint, pool) in expected.items():
        spec = deployments[name]
        assert spec["entrypoint"] == entrypoint, name
        assert spec["work_pool"]["name"] == pool, name
    assert set(deployments) == set(expected) | set(OTHER_FLOWS)
    for name, entrypoint in OTHER_FLOWS.items():
        assert deployments[name]["entrypoint"] == entrypoint


def test_every_entrypoint_loads_the_flow_it_is_named_after(deployments):
    for spec in deployments.values():
        base = spec["name"].partition("-on-")[0]
        assert load_flow(spec["entrypoint"]).name == base, spec["entrypoint"]


def test_the_graph_is_ordered_and_each_stage_dispatched_once():
    seen: set[str] = set()
    for stage in STAGES:
        assert set(stage.reads) <= seen, f"{stage.name} reads a stage that runs after it"
        seen.add(stage.name)
    dispatched = [s for unit in PIPELINE_UNITS for s in unit.stages]
    assert dispatched == list(STAGES), "units run every stage once, in graph order"
    for unit in PIPELINE_UNITS:
        assert {s.pool for s in unit.stages} == {unit.pool}, unit
        assert unit.routed_by in unit.stage_names


def test_a_refresh_is_the_graphs_prepare_to_train_slice_with_only_training_on_gpu(deployments):
    assert [u.flow_name for u in REFRESH_UNITS] == ["prepare-data", "train"]
    assert REFRESH_UNITS == PIPELINE_UNITS[:2]
    assert units_through("preprocess") == PIPELINE_UNITS[:1]
    assert home_pools(REFRESH_UNITS) == {"prepare-data": "cpu-pool", "train": "gpu-pool"}
    # the refresh flow only orchestrates: it holds no GPU slot while its units run
    assert deployments["model-refresh"]["work_pool"]["name"] == "cpu-pool"
    with pytest.raises(KeyError):
        units_through("no-such-stage")


def test_schedules_and_the_project_pull_step(deployments):
    spec = yaml.safe_load(PREFECT_YAML.read_text())
    pipeline = deployments["pipeline"]
    assert [s["cron"] for s in pipeline["schedules"]] == ["0 2 * * *"]
    assert pipeline["parameters"]["params"]["events"] == "{{ $HYBRIDFLOW_DEPLOY_EVENTS }}"
    assert [s["interval"] for s in deployments["model-refresh"]["schedules"]] == [86400]
    step = spec["pull"][0]["prefect.deployments.steps.set_working_directory"]
    assert step["directory"] == "{{ $HYBRIDFLOW_PROJECT_DIR }}"


def test_a_unit_is_complete_only_when_all_its_manifests_exist(local_store):
    stages = tuple(
        Stage(n, n, f"flows/{n}.py:f", "cpu-pool", WorkloadKind.PREPROCESSING, "events")
        for n in ("a", "b", "c")
    )
    unit = DispatchUnit("abc", "flows/abc.py:f", stages, routed_by="b")
    for name in ("a", "b"):
        local_store.put_bytes(stage_manifest_key("run-x", name), b"{}")
    assert not is_complete(local_store, "run-x", unit)
    local_store.put_bytes(stage_manifest_key("run-x", "c"), b"{}")
    assert is_complete(local_store, "run-x", unit)
    assert not is_complete(local_store, "run-y", unit)


def _plan(train_pool: str) -> RoutingPlan:
    def decision(stage: Stage, pool: str) -> RoutingDecision:
        return RoutingDecision(
            stage=stage.name,
            kind=stage.kind,
            pool=pool,
            alternative=None,
            reason="test",
            basis="pinned",
            estimates=[],
        )

    return RoutingPlan(
        decisions=[decision(s, train_pool if s.name == "train" else s.pool) for s in STAGES]
    )


def test_both_executors_follow_the_same_plan():
    on_cpu, on_gpu = _plan("cpu-pool"), _plan("gpu-pool")
    # embedded trains on the CPU when the router sends training to cpu-pool ...
    assert routed_device("auto", on_cpu) == "cpu" and routed_device("auto", on_gpu) == "auto"
    assert routed_device("cuda", on_cpu) == "cuda", "an explicit device always wins"
    # ... and deployed dispatches the train unit to cpu-pool under the same plan
    assert unit_pools(on_cpu) == {
        "prepare-data": "cpu-pool",
        "train": "cpu-pool",
        "batch-inference": "cpu-pool",
    }
    assert unit_pools(on_gpu)["train"] == "gpu-pool"


def test_a_refresh_asks_the_router_where_its_units_run():
    """A refresh's units go where the router puts their routing stage (as the pipeline's do),
    not to fixed home pools: the router sizes the slice's stages and may keep training on the
    CPU."""
    assert [w.stage for w in routed_stages(REFRESH_UNITS)] == [
        "validate",
        "features",
        "preprocess",
        "train",
    ]
    on_cpu, on_gpu = _plan("cpu-pool"), _plan("gpu-pool")
    assert unit_pools(on_cpu, REFRESH_UNITS) == {"prepare-data": "cpu-pool", "train": "cpu-pool"}
    assert unit_pools(on_gpu, REFRESH_UNITS) == {"prepare-data": "cpu-pool", "train": "gpu-pool"}
    source = inspect.getsource(refresh_flow.fn)
    assert "plan_pipeline(" in source and "routed_device(" in source
    assert "unit_pools(plan, REFRESH_UNITS)" in source and "home_pools" not in source


def test_stage_origins_cover_every_stage():
    from flows.executors import UnitOrigin

    origins = stage_origins(
        {u.flow_name: UnitOrigin(pool="gpu-pool", cached=True) for u in PIPELINE_UNITS}
    )
    assert set(origins) == {s.name for s in STAGES}
    assert all(o.pool == "gpu-pool" and o.reused for o in origins.values())


def test_mode_auto_is_embedded_outside_a_deployment_run():
    assert dispatch_mode("auto") == "embedded"
    assert dispatch_mode("deployed") == "deployed"


def test_progress_artifact_keys_are_what_prefect_accepts():
    assert progress_artifact_key("batch_inference") == "progress-batch-inference"
    assert progress_artifact_key("Train model") == "progress-train-model"


def test_each_family_gets_its_own_contender_unit_on_the_pool_the_plan_chose():
    from flows.params import StageParams
    from flows.pipeline import contender_units

    def decision(stage: str, pool: str) -> RoutingDecision:
        return RoutingDecision(
            stage=stage,
            kind=WorkloadKind.TRAINING,
            pool=pool,
            alternative=None,
            reason="test",
            basis="pinned",
            estimates=[],
        )

    plan = RoutingPlan(
        decisions=[
            decision("contender-logistic", "cpu-pool"),
            decision("contender-mlp", "gpu-pool"),
        ]
    )
    units = contender_units(StageParams(run_id="run-k"), plan, ["logistic", "mlp"])
    pool, params = units["logistic"]
    assert pool == "cpu-pool" and params.families == ["logistic"] and params.device == "cpu"
    pool, params = units["mlp"]
    assert pool == "gpu-pool" and params.families == ["mlp"] and params.device == "auto"
    assert params.run_id == "run-k"
    assert CONTENDER_UNIT.deployment_on("gpu-pool") == "contender/contender-on-gpu-pool"
    assert CONTENDER_UNIT.deployment_on("cpu-pool") == "contender/contender"
