"""`hybridflow up`'s deploy step against a real Prefect API: schedules are deployed paused
unless asked for, so a stack (a test stack above all) never fires on the wall clock.

One `prefect deploy --all` (~15-20 s of CPU): the paused one. With `--schedules` up deploys the
project's prefect.yaml as it is, whose schedules declare `active: true`
(tests/unit/flows/test_trigger_specs.py checks both commands); that Prefect applies a declared
`active` is what the paused deploy here proves."""

from __future__ import annotations

import os

import pytest

from infra.stack import prefect_admin
from infra.stack.lifecycle import project_dir

pytestmark = pytest.mark.integration
SCHEDULED = ("pipeline/pipeline", "model-refresh/model-refresh")


def _schedules(client) -> dict[str, list[bool]]:
    return {
        name: [s.active for s in client.read_deployment_by_name(name).schedules]
        for name in SCHEDULED
    }


@pytest.mark.slow(reason="`prefect deploy --all`, importing every flow of prefect.yaml")
def test_schedules_are_deployed_paused_unless_asked_for(prefect_harness, tmp_path):
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL

    api_url = PREFECT_API_URL.value()
    prefect_admin.ensure_work_pools(api_url, gpu_slots=1)
    env = os.environ | {
        "PREFECT_API_URL": api_url,
        "HYBRIDFLOW_PROJECT_DIR": str(project_dir()),
        "HYBRIDFLOW_DEPLOY_EVENTS": str(tmp_path / "events"),
    }
    log_file = tmp_path / "logs" / "deploy.log"
    prefect_admin.deploy_all(project_dir(), env, log_file, schedules_active=False)
    with get_client(sync_client=True) as client:
        assert _schedules(client) == {name: [False] for name in SCHEDULED}
        pipeline = client.read_deployment_by_name("pipeline/pipeline")
        assert [s.schedule.cron for s in pipeline.schedules] == ["0 2 * * *"]
        assert pipeline.entrypoint == "flows/pipeline.py:pipeline_flow"
    # the event triggers of model-refresh are not schedules: on in a paused stack too
    assert prefect_admin.refresh_triggers(api_url) == [
        "hybridflow: refresh a stale production on new data (on)",
        "hybridflow: refresh production on drift (on)",
    ]
    # the safety-net setting changes the interval but leaves the schedule paused
    line = prefect_admin.ensure_refresh_schedule(api_url, 12, active=False)
    assert line == "refresh safety net: every 12h (paused with the other schedules)"
    with get_client(sync_client=True) as client:
        assert _schedules(client) == {name: [False] for name in SCHEDULED}
        refresh = client.read_deployment_by_name("model-refresh/model-refresh")
        assert [s.schedule.interval.total_seconds() for s in refresh.schedules] == [43200.0]

    # and with the schedules live (up --schedules): the new interval, active
    line = prefect_admin.ensure_refresh_schedule(api_url, 6, active=True)
    assert line == "refresh safety net: every 6h"
    with get_client(sync_client=True) as client:
        refresh = client.read_deployment_by_name("model-refresh/model-refresh")
        assert [(s.active, s.schedule.interval.total_seconds()) for s in refresh.schedules] == [
            (True, 21600.0)
        ]
