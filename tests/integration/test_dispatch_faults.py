"""Deployed dispatch against a real Prefect API when a pool has no worker: the pipeline does not
wait forever — the child is cancelled after the start deadline and the failure says why; a child
that a worker did start is waited for however long it runs."""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from flows.dag import DispatchUnit, Stage
from flows.executors import DispatchTiming, StageRunFailed, run_or_reuse, wait_for_child
from flows.params import StageParams
from infra.routing.router import WorkloadKind

pytestmark = pytest.mark.integration


def _deployment_on_an_empty_pool(client, name: str) -> DispatchUnit:
    """A work pool nobody polls and a deployment on it."""
    from prefect.client.schemas.actions import WorkPoolCreate

    pool = f"{name}-pool"
    client.create_work_pool(WorkPoolCreate(name=pool, type="process"))
    flow_id = client.create_flow_from_name(name)
    client.create_deployment(
        flow_id=flow_id, name=name, work_pool_name=pool, entrypoint="flows/train.py:train_flow"
    )
    stage = Stage(name, name, "flows/train.py:train_flow", pool, WorkloadKind.TRAINING, "customers")
    return DispatchUnit(name, "flows/train.py:train_flow", (stage,), routed_by=name)


def _params(tmp_path) -> StageParams:
    return StageParams(events=str(tmp_path / "events"), run_id=f"run-{uuid.uuid4().hex[:8]}")


def test_a_pool_without_a_worker_fails_the_dispatch_and_cancels_the_child(
    prefect_harness, local_store, tmp_path
):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterName

    name = f"orphan-{uuid.uuid4().hex[:6]}"
    with get_client(sync_client=True) as client:
        unit = _deployment_on_an_empty_pool(client, name)
    timing = DispatchTiming(poll_s=0.2, start_timeout_s=2.0)
    with pytest.raises(StageRunFailed) as failed:
        run_or_reuse(unit, unit.pool, _params(tmp_path), local_store, timing)
    message = str(failed.value)
    assert f"stage {name}/{name}" in message and "no worker picked it up within 2s" in message
    assert f"work pool {unit.pool} has no online worker" in message
    assert f"prefect worker start --pool {unit.pool}" in message
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(
            deployment_filter=DeploymentFilter(name=DeploymentFilterName(any_=[name]))
        )
    assert [r.state_type.value for r in runs] == ["CANCELLED"], "the child was left waiting"


def test_a_started_child_is_waited_for_past_the_start_deadline(prefect_harness):
    from prefect.client.orchestration import get_client
    from prefect.states import Completed, Running

    name = f"slow-{uuid.uuid4().hex[:6]}"
    with get_client(sync_client=True) as client:
        unit = _deployment_on_an_empty_pool(client, name)
        deployment = client.read_deployment_by_name(f"{name}/{name}")
        run = client.create_flow_run_from_deployment(deployment.id)
        client.set_flow_run_state(run.id, Running(), force=True)  # as a worker would

    def finish_later() -> None:
        time.sleep(1.0)
        with get_client(sync_client=True) as worker:
            worker.set_flow_run_state(run.id, Completed(), force=True)

    finisher = threading.Thread(target=finish_later)
    finisher.start()
    timing = DispatchTiming(poll_s=0.1, start_timeout_s=0.01)  # long past while it runs
    child = wait_for_child(run.id, unit.deployment_on(unit.pool), unit.pool, timing)
    finisher.join()
    assert child.state.is_completed()
