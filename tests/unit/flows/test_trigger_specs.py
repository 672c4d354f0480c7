"""prefect.yaml's model-refresh triggers against the events hybridflow emits: they parse as
Prefect deployment triggers, match exactly the events meant for them, and Prefect's own template
rendering turns each event into valid refresh parameters that say why the refresh runs."""

from __future__ import annotations

import copy
import datetime as dt
from pathlib import Path

import pytest
import yaml
from prefect.events import DeploymentTriggerTypes, Event, Resource
from prefect.server.events.actions import RunDeployment
from prefect.utilities.schema_tools.hydration import HydrationContext, hydrate
from pydantic import TypeAdapter

from flows.events import (
    DRIFT_DETECTED,
    EVENTS_LANDED,
    EventSpec,
    drift_detected,
    events_landed,
    log_segments_landed,
    model_promoted,
)
from flows.refresh import RefreshParams
from tasks.data.drift_records import DriftReport, DriftRow
from tasks.policy.refresh import RefreshDecision

PREFECT_YAML = Path(__file__).resolve().parents[3] / "prefect.yaml"
AS_OF = dt.date(2025, 12, 31)


@pytest.fixture(scope="module")
def refresh() -> dict:
    spec = yaml.safe_load(PREFECT_YAML.read_text())
    return next(d for d in spec["deployments"] if d["name"] == "model-refresh")


@pytest.fixture(scope="module")
def triggers(refresh) -> dict[str, object]:
    adapter = TypeAdapter(DeploymentTriggerTypes)
    parsed = [adapter.validate_python(copy.deepcopy(t)) for t in refresh["triggers"]]
    return {next(iter(t.expect)): t for t in parsed}


def _report(drifted: bool) -> DriftReport:
    rows = [
        DriftRow.measured("purchases_90d", "psi", 0.31 if drifted else 0.02, 0.1),
        DriftRow.measured("top_channel_share", "psi", 0.05, 0.1),
    ]
    return DriftReport(
        run_id="run-abc",
        as_of=AS_OF,
        model_version="m-1",
        reference_as_of=dt.date(2025, 9, 30),
        reference_horizon_days=90,
        rows_compared=100,
        rows=rows,
        seconds=1.0,
    )


def _decision(reason) -> RefreshDecision:
    return RefreshDecision(
        reason=reason,
        explanation="new data and production is 30.0h old (> 24h)" if reason else "no drift",
        new_data=True,
        production_version="m-1",
        production_age_hours=30.0,
        max_production_age_hours=24.0,
    )


def _event(spec: EventSpec) -> Event:
    return Event(
        event=spec.name, resource=spec.resource, related=spec.related, payload=spec.payload
    )


def _rendered_params(trigger, event: Event) -> RefreshParams:
    """The refresh parameters Prefect's RunDeployment action renders for ``event``."""
    parameters = copy.deepcopy(trigger.parameters)
    RunDeployment._upgrade_v1_templates(parameters)
    rendered = hydrate(
        parameters,
        HydrationContext(raise_on_error=True, render_jinja=True, jinja_context={"event": event}),
    )
    return RefreshParams.model_validate(rendered["params"])


def test_the_two_triggers_listen_for_the_events_flows_emit(triggers):
    assert set(triggers) == {DRIFT_DETECTED, EVENTS_LANDED}
    for trigger in triggers.values():
        assert trigger.posture == "Reactive" and trigger.threshold == 1 and trigger.enabled


def test_a_drift_event_starts_a_refresh_on_the_drifted_data(triggers):
    spec = drift_detected(_report(True), "/data/new-events", "f" * 64, "drift at 2025-12-31")
    event = _event(spec)
    trigger = triggers[DRIFT_DETECTED]
    assert trigger.match.matches(event.resource)
    params = _rendered_params(trigger, event)
    assert params.trigger == "drift" and params.events == "/data/new-events"
    assert params.as_of == AS_OF and params.reason == "drift at 2025-12-31"
    assert params.trigger_event == str(event.id)
    assert params.run_label == "refresh-drift-2025-12-31"
    assert spec.payload["drifted"] == {"purchases_90d psi": 0.31}


def test_landed_data_starts_a_refresh_only_when_it_asks_for_one(triggers):
    trigger = triggers[EVENTS_LANDED]
    stale = _event(events_landed("/data/new-events", "a" * 64, AS_OF, 500, _decision("new-data")))
    assert trigger.match.matches(stale.resource)
    params = _rendered_params(trigger, stale)
    assert params.trigger == "new-data" and params.events == "/data/new-events"
    assert params.reason == "new data and production is 30.0h old (> 24h)"
    for reason in (None, "drift"):  # fresh production; or drift, which has its own trigger
        quiet = _event(events_landed("/data/x", "b" * 64, AS_OF, 500, _decision(reason)))
        assert not trigger.match.matches(quiet.resource), reason


def test_no_other_hybridflow_event_matches_a_refresh_trigger(triggers):
    promoted = _event(model_promoted("m-2", "m-1", {"auc": 0.9}, "better", {"trigger": "drift"}))
    for trigger in triggers.values():
        assert not trigger.match.matches(promoted.resource) or promoted.event not in trigger.expect
    assert not triggers[DRIFT_DETECTED].match.matches(
        Resource({"prefect.resource.id": "hybridflow.events.abc"})
    )


def test_the_schedule_is_a_daily_safety_net_that_says_so(refresh):
    (schedule,) = refresh["schedules"]
    assert schedule["interval"] == 86400
    params = schedule["parameters"]["params"]
    assert params["trigger"] == "schedule"
    assert params["events"] == refresh["parameters"]["params"]["events"]


def test_the_paused_copy_up_deploys_keeps_the_triggers_and_pauses_the_safety_net(refresh, tmp_path):
    from infra.stack.prefect_admin import write_paused_copy

    target = tmp_path / "prefect-schedules-paused.yaml"
    assert write_paused_copy(PREFECT_YAML, target) >= 1
    paused = next(
        d for d in yaml.safe_load(target.read_text())["deployments"] if d["name"] == "model-refresh"
    )
    assert [s["active"] for s in paused["schedules"]] == [False]
    assert paused["triggers"] == refresh["triggers"]
    assert all(t["enabled"] for t in paused["triggers"])


def test_deploy_uses_the_paused_copy_unless_schedules_are_asked_for(tmp_path):
    """What ``up`` hands ``prefect deploy``: with ``--schedules`` the project's prefect.yaml as it
    is, whose every schedule declares itself active; else the paused copy. (That Prefect applies
    a schedule's declared ``active`` is proven against a real API by the paused deploy in
    tests/integration/test_stack_deploy.py and by the e2e stacks.)"""
    from infra.stack.prefect_admin import deploy_command

    project = PREFECT_YAML.parent
    active = deploy_command(project, tmp_path, schedules_active=True)
    assert Path(active[0]).name == "prefect" and active[1:] == ["--no-prompt", "deploy", "--all"]
    assert not list(tmp_path.iterdir())
    declared = [
        s.get("active", True)
        for d in yaml.safe_load(PREFECT_YAML.read_text())["deployments"]
        for s in d.get("schedules") or []
    ]
    assert declared and all(a is True for a in declared), declared
    paused = deploy_command(project, tmp_path, schedules_active=False)
    assert paused[: len(active)] == active and paused[len(active)] == "--prefect-file"
    spec = yaml.safe_load(Path(paused[-1]).read_text())
    assert [s["active"] for d in spec["deployments"] for s in d.get("schedules") or []] == [
        False
    ] * len(declared)


def test_segments_of_the_events_log_start_a_refresh_on_the_log_like_files_do(triggers):
    trigger = triggers[EVENTS_LANDED]
    log = "s3://bucket/store/events-log/segments"
    ids = ["sha256:" + "a" * 64, "batch-17"]
    stale = log_segments_landed(log, 4, 5, ids, AS_OF, 1200, _decision("new-data"))
    event = _event(stale)
    assert trigger.match.matches(event.resource)
    params = _rendered_params(trigger, event)
    assert params.trigger == "new-data" and params.events == log and params.as_of == AS_OF
    assert stale.payload["segments"] == [4, 5] and stale.payload["rows"] == 1200
    other = log_segments_landed(log, 6, 6, ["batch-18"], AS_OF, 10, _decision("new-data"))
    assert other.resource["prefect.resource.id"] != stale.resource["prefect.resource.id"]
    fresh = _event(log_segments_landed(log, 4, 5, ids, AS_OF, 1200, _decision(None)))
    assert not trigger.match.matches(fresh.resource)
