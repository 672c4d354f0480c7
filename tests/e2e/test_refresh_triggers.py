"""Refresh when it matters, on the deployed stack: `hybridflow up` installs model-refresh's
triggers; a pipeline run on unshifted data starts no refresh; a pipeline run on shifted data
emits hybridflow.drift.detected and the trigger starts model-refresh without anyone calling it;
the refresh dispatches its prepare-data unit to cpu-pool and its training where its routing plan puts it, goes
through the gate and the endpoint serves whatever production is
then. (Both pipeline runs are `hybridflow run` against the stack's server: the same flow and the
same events as a run of the pipeline deployment, in one process instead of one per dispatched
stage, which keeps this test to a few minutes; tests/e2e/test_deployed_stack.py covers dispatch.)

Nothing here waits on the clock: up deploys the schedules paused (and the safety net is off),
and every wait is on a state (a run finished, an event stored, the endpoint's model version).
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import httpx
import pytest

from tests.e2e.stack_driver import FINAL, child_runs, cli, keep_logs, stack_state, wait_for
from tests.integration.serving_process import running_server

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1500)]

T = "2025-12-31"
# `hybridflow demo-data --customers 1500 --seed 5 [--shift-after ...]`, generated in this process
SHIFT = {"shift_after": dt.date(2025, 10, 2), "shift_purchase_factor": 3, "shift_app_share": 0.8}
DEMO = {"customers": 1500, "seed": 5}


@pytest.fixture
def stack_env(stack_base_env, tmp_path) -> dict[str, str]:
    return stack_base_env | {
        "HYBRIDFLOW_STORE": str(tmp_path / "store"),
        "HYBRIDFLOW_REFRESH__SAFETY_NET_HOURS": "0",  # no wall-clock refresh during the test
        "HYBRIDFLOW_SERVE__POLL_INTERVAL_S": "0.5",
        # one family: what is proven here is when a refresh runs and where, not the contest
        # (tests/e2e/test_deployed_stack.py and the integration tests run several families)
        "HYBRIDFLOW_TRAIN__FAMILIES": "logistic",
    }


@pytest.mark.slow(
    reason="a stack (server, both workers), two `hybridflow run` pipelines against it and the refresh its trigger starts"
)
def test_drift_starts_a_refresh_through_a_trigger_and_serving_follows(
    stack_env, tmp_path, output_dir
):
    from infra.stack.processes import ProcessRecord, is_alive, kill_tree
    from tasks.data.demo_events import DemoDataParams, generate_demo_events

    base, shifted = tmp_path / "base", tmp_path / "shifted"
    generate_demo_events(DemoDataParams(**DEMO), base)
    generate_demo_events(DemoDataParams(**DEMO, **SHIFT), shifted)
    stack_dir = Path(stack_env["HYBRIDFLOW_STACK_DIR"])
    recorded: list[ProcessRecord] = []
    try:
        # no Spark cluster: the pipeline runs here are `hybridflow run`, the refresh trains on
        # gpu-pool; test_deployed_stack.py runs the CPU stages on the cluster
        up = ["up", "--port", stack_env["PORT"], "--events", str(base), "--spark-workers", "0"]
        out = cli(up, stack_env)
        recorded = [
            ProcessRecord.model_validate(p) for p in stack_state(stack_dir)["processes"].values()
        ]
        assert "refresh production on drift (on)" in out, out
        assert "refresh a stale production on new data (on)" in out, out
        assert "refresh safety net: off" in out, out
        timings = _drive(stack_env, base, shifted, tmp_path)
        (output_dir / "timings.json").write_text(json.dumps(timings, indent=2))
        cost = cli(["cost"], stack_env)
        (output_dir / "cost.txt").write_text(cost)
        assert "refreshes run: 1 (1 drift)" in cost and "skipped: 1 " in cost, cost
    finally:
        down = cli(["down"], stack_env, timeout=120)
        leftovers = [r for r in recorded if is_alive(r)]
        for record in leftovers:
            kill_tree(record)
        keep_logs(stack_dir, output_dir)
    assert "server" in down and not leftovers, f"still running after down: {leftovers}"


def _planned_pool(client, flow_run_id, stage: str) -> str:
    """The pool the routing plan a flow run published (its ``routing-plan`` table) gives
    ``stage``."""
    from prefect.client.schemas.filters import (
        ArtifactFilter,
        ArtifactFilterKey,
        FlowRunFilter,
        FlowRunFilterId,
    )

    (plan,) = client.read_artifacts(
        artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["routing-plan"])),
        flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])),
    )
    rows = json.loads(plan.data) if isinstance(plan.data, str) else plan.data
    return next(r["pool"] for r in rows if r["stage"] == stage)


def _drive(stack_env, base: Path, shifted: Path, tmp_path: Path) -> dict[str, float]:
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    api = f"http://127.0.0.1:{stack_env['PORT']}/api"
    with temporary_settings({PREFECT_API_URL: api}), get_client(sync_client=True) as client:
        refresh = client.read_deployment_by_name("model-refresh/model-refresh")
        assert refresh.schedules and not any(s.active for s in refresh.schedules)

        # unshifted data, run in this process against the stack's server: production is
        # trained, nothing drifts, no refresh is asked for
        first = _run_here(stack_env, api, base)
        assert first["drift"]["status"] == "stable", first["drift"]
        assert first["drift"]["refresh"]["reason"] == "skipped"
        run = first["flow_run_id"]
        landed = wait_for("run 1's landed event", lambda: _events(api, "landed", run), 60)
        assert landed[0]["resource"]["hybridflow.refresh.reason"] == "none", landed
        assert _events(api, "drift", run) == []
        store = stack_env["HYBRIDFLOW_STORE"]
        with running_server(Path(store), tmp_path / "serve", env=_serve_env(stack_env)) as server:
            v1 = _production(store)
            wait_for("the endpoint to serve v1", lambda: _served(server.url) == v1, 60)

            # shifted data: drift is detected, and the trigger starts the refresh by itself
            second = _run_here(stack_env, api, shifted)
            assert second["drift"]["status"] == "drifted", second["drift"]
            assert second["drift"]["refresh"]["reason"] == "drift"
            run = second["flow_run_id"]
            (drift,) = wait_for("the drift event", lambda: _events(api, "drift", run), 60)
            assert drift["resource"]["hybridflow.refresh.reason"] == "drift"
            assert drift["payload"]["as_of"] == T and drift["payload"]["events"] == str(shifted)
            refreshed = wait_for(
                "the triggered refresh to finish",
                lambda: _finished(client, _refresh_runs(client, refresh.id)),
                timeout=600,
                every=2.0,
            )
            assert refreshed.state_type.value == "COMPLETED", refreshed.state
            # the refresh only orchestrates (cpu-pool): its CPU stages ran on cpu-pool and its
            # training where the router put it (the refresh's own routing plan)
            assert refreshed.work_pool_name == "cpu-pool"
            children = child_runs(client, refreshed.id)
            assert set(children) == {"prepare-data", "train"}, children
            assert children["prepare-data"].work_pool_name == "cpu-pool"
            assert children["train"].work_pool_name == _planned_pool(client, refreshed.id, "train")
            assert all(c.state_type.value == "COMPLETED" for c in children.values())
            # the UI's "created by" of the run names the automation the trigger installed
            assert refreshed.created_by and refreshed.created_by.type == "AUTOMATION"
            assert refreshed.created_by.display_value == "hybridflow: refresh production on drift"
            assert refreshed.name.startswith(f"refresh-drift-{T}"), refreshed.name
            params = refreshed.parameters["params"]
            assert params["trigger"] == "drift" and params["trigger_event"] == drift["id"]
            assert params["events"] == str(shifted)
            assert len(_refresh_runs(client, refresh.id)) == 1, "run 1 must not have started one"

            production = _production(store)
            _gate_decided(store, api, refreshed, production)
            wait_for(
                "the endpoint to serve production",
                lambda: _served(server.url) == production,
                60,
            )
    occurred = dt.datetime.fromisoformat(drift["occurred"])
    return {
        "drift_event_to_refresh_run_created_s": (refreshed.created - occurred).total_seconds(),
        "refresh_run_seconds": (refreshed.end_time - refreshed.start_time).total_seconds(),
    }


def _run_here(stack_env, api: str, events: Path) -> dict:
    """``hybridflow run --json`` in this process's environment, reporting to the stack."""
    env = stack_env | {"PREFECT_API_URL": api}
    out = cli(["run", "--events", str(events), "--as-of", T, "--device", "cpu", "--json"], env, 900)
    # cli() returns stdout then stderr: the summary is stdout's last line
    return json.loads(next(line for line in reversed(out.splitlines()) if line.startswith("{")))


def _finished(client, runs):
    final = [r for r in runs if r.state_type and r.state_type.value in FINAL]
    return final[0] if final else None


def _refresh_runs(client, deployment_id) -> list:
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

    return client.read_flow_runs(
        deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id]))
    )


def _events(api: str, name: str, flow_run_id) -> list[dict]:
    """``hybridflow.<name>`` events that flow run ``flow_run_id`` emitted."""
    full = {"landed": "hybridflow.events.landed", "drift": "hybridflow.drift.detected"}
    body = {
        "filter": {
            "event": {"name": [full.get(name, f"hybridflow.{name}")]},
            "related": {"id": [f"prefect.flow-run.{flow_run_id}"]},
        },
        "limit": 50,
    }
    response = httpx.post(f"{api}/events/filter", json=body, timeout=10)
    response.raise_for_status()
    return response.json()["events"]


def _production(store: str) -> str:
    from infra.storage.registry import ModelRegistry
    from infra.storage.store import open_store

    alias = ModelRegistry(open_store(store)).alias()
    assert alias is not None, "no production model"
    return alias.version


def _gate_decided(store: str, api: str, refreshed, production: str) -> None:
    """The refresh's train stage went through the gate; a promotion says so in an event."""
    from infra.storage.store import open_store
    from tasks.reporting.records import TrainResult, read_stage_manifest

    trained = read_stage_manifest(open_store(store), str(refreshed.id), "train", TrainResult)
    assert trained.decision_reason, "the gate gave no reason"
    if trained.promoted:
        assert production == trained.model_version
        (promoted,) = wait_for(
            "the promotion event", lambda: _events(api, "model.promoted", refreshed.id), 60
        )
        assert promoted["payload"]["trigger"] == "drift"
    else:
        assert production == trained.production_version


def _serve_env(stack_env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in stack_env.items() if k.startswith("HYBRIDFLOW_")}


def _served(url: str) -> str | None:
    response = httpx.get(f"{url}/ready", timeout=5)
    return response.json()["model_version"] if response.status_code == 200 else None
