"""prefect.yaml against the code: every deployment names a real flow on the pool its stage
belongs to, the dispatch table only names deployments that exist, the pipeline is scheduled."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import yaml

from flows._glue import POOL_BY_STAGE
from flows.dispatch import DEPLOYED_DAG, DeployedStage, dispatch_mode, is_complete
from tasks.stage_records import stage_key

PREFECT_YAML = Path(__file__).resolve().parents[3] / "prefect.yaml"
STAGE_OF_FLOW = {"batch-inference": "batch_inference", "model-refresh": "train"}


@pytest.fixture(scope="module")
def deployments() -> dict[str, dict]:
    spec = yaml.safe_load(PREFECT_YAML.read_text())
    return {d["name"]: d for d in spec["deployments"]}


def _flow_name(entrypoint: str) -> str:
    path, _, attr = entrypoint.partition(":")
    module = importlib.import_module(path.removesuffix(".py").replace("/", "."))
    return getattr(module, attr).name


def test_each_deployment_runs_its_flow_on_its_stage_pool(deployments):
    for name, spec in deployments.items():
        base, _, routed_pool = name.partition("-on-")
        assert _flow_name(spec["entrypoint"]) == base, spec["entrypoint"]
        stage = STAGE_OF_FLOW.get(base, base)
        pool = spec["work_pool"]["name"]
        assert pool == (routed_pool or POOL_BY_STAGE.get(stage, "cpu-pool")), (name, pool)
    assert deployments["train"]["work_pool"]["name"] == "gpu-pool"
    refresh = deployments["model-refresh"]
    assert refresh["work_pool"]["name"] == "gpu-pool"
    assert [s["interval"] for s in refresh["schedules"]] == [21600]


def test_dispatch_table_matches_prefect_yaml(deployments):
    for unit in DEPLOYED_DAG:
        flow_name, _, deployment = unit.deployment.partition("/")
        assert flow_name == deployment and deployment in deployments, unit
        assert deployments[deployment]["work_pool"]["name"] == unit.pool
        assert {POOL_BY_STAGE[s] for s in unit.stages} == {unit.pool}, unit
        other = "gpu-pool" if unit.pool == "cpu-pool" else "cpu-pool"
        routed = unit.deployment_on(other).partition("/")[2]
        assert deployments[routed]["work_pool"]["name"] == other, "routable on each pool"
    dispatched = [s for unit in DEPLOYED_DAG for s in unit.stages]
    assert sorted(dispatched) == sorted(POOL_BY_STAGE), "every stage dispatched exactly once"


def test_pipeline_is_scheduled_nightly_and_pulls_the_project(deployments):
    spec = yaml.safe_load(PREFECT_YAML.read_text())
    pipeline = deployments["pipeline"]
    assert [s["cron"] for s in pipeline["schedules"]] == ["0 2 * * *"]
    assert pipeline["parameters"]["params"]["events"] == "{{ $HYBRIDFLOW_DEPLOY_EVENTS }}"
    step = spec["pull"][0]["prefect.deployments.steps.set_working_directory"]
    assert step["directory"] == "{{ $HYBRIDFLOW_PROJECT_DIR }}"


def test_a_unit_is_complete_only_when_all_its_manifests_exist(local_store):
    unit = DeployedStage("prepare-data/prepare-data", ("validate", "features", "preprocess"))
    for stage in unit.stages[:2]:
        local_store.put_bytes(stage_key("run-x", stage), b"{}")
    assert not is_complete(local_store, "run-x", unit)
    local_store.put_bytes(stage_key("run-x", "preprocess"), b"{}")
    assert is_complete(local_store, "run-x", unit)
    assert not is_complete(local_store, "run-y", unit)


def test_mode_auto_is_embedded_outside_a_deployment_run():
    assert dispatch_mode("auto") == "embedded"
    assert dispatch_mode("deployed") == "deployed"
