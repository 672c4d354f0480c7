"""Idempotent set-up of a Prefect server: work pools, the zombie-run automation, deployments
(whose prefect.yaml triggers ``prefect deploy`` re-creates), the refresh safety-net schedule."""

from __future__ import annotations

import datetime as dt
import logging
import subprocess
from pathlib import Path

import yaml

from infra.routing.pools import CPU_POOL, GPU_POOL, POOLS
from infra.stack.services import bin_path

log = logging.getLogger(__name__)

ZOMBIE_AUTOMATION = "hybridflow: crash flow runs that stop sending heartbeats"


def ensure_work_pools(api_url: str, gpu_slots: int) -> list[str]:
    """Create cpu-pool and gpu-pool (process type) if missing; gpu-pool runs at most
    ``gpu_slots`` flow runs at a time. Returns what was done, one line per pool."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate, WorkPoolUpdate
    from prefect.exceptions import ObjectNotFound
    from prefect.settings import PREFECT_API_URL, temporary_settings

    limits = {CPU_POOL: None, GPU_POOL: gpu_slots}
    done = []
    with temporary_settings({PREFECT_API_URL: api_url}), get_client(sync_client=True) as client:
        for pool in POOLS:
            try:
                existing = client.read_work_pool(pool)
            except ObjectNotFound:
                client.create_work_pool(
                    WorkPoolCreate(name=pool, type="process", concurrency_limit=limits[pool])
                )
                done.append(f"created work pool {pool} (concurrency {limits[pool] or 'unlimited'})")
                continue
            if existing.type != "process":
                done.append(f"work pool {pool} exists with type {existing.type!r}; left as is")
            elif existing.concurrency_limit != limits[pool]:
                client.update_work_pool(pool, WorkPoolUpdate(concurrency_limit=limits[pool]))
                done.append(f"work pool {pool}: concurrency set to {limits[pool] or 'unlimited'}")
            else:
                done.append(f"work pool {pool} already there")
    return done


def ensure_zombie_automation(api_url: str, crash_after_s: int) -> str:
    """The automation that marks a flow run Crashed when its heartbeats stop (a killed worker
    or machine), so nothing stays RUNNING forever. Re-created when its timing changed."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.objects import StateType
    from prefect.events.actions import ChangeFlowRunState
    from prefect.events.schemas.automations import AutomationCore, EventTrigger, Posture
    from prefect.events.schemas.events import ResourceSpecification
    from prefect.settings import PREFECT_API_URL, temporary_settings

    within = dt.timedelta(seconds=crash_after_s)
    automation = AutomationCore(
        name=ZOMBIE_AUTOMATION,
        description="hybridflow up: heartbeats missing -> Crashed",
        trigger=EventTrigger(
            after={"prefect.flow-run.heartbeat"},
            expect={
                "prefect.flow-run.heartbeat",
                "prefect.flow-run.Completed",
                "prefect.flow-run.Failed",
                "prefect.flow-run.Cancelled",
                "prefect.flow-run.Crashed",
            },
            match=ResourceSpecification({"prefect.resource.id": ["prefect.flow-run.*"]}),
            for_each={"prefect.resource.id"},
            posture=Posture.Proactive,
            threshold=1,
            within=within,
        ),
        actions=[
            ChangeFlowRunState(
                state=StateType.CRASHED,
                message=f"no heartbeat for {crash_after_s}s: its worker or machine died",
            )
        ],
    )
    with temporary_settings({PREFECT_API_URL: api_url}), get_client(sync_client=True) as client:
        existing = client.read_automations_by_name(ZOMBIE_AUTOMATION)
        if existing and all(getattr(a.trigger, "within", None) == within for a in existing):
            return "crash-detection automation already there"
        for old in existing:
            client.delete_automation(old.id)
        client.create_automation(automation)
    return f"crash-detection automation set (no heartbeat for {crash_after_s}s -> Crashed)"


def deploy_command(project_dir: Path, work_dir: Path, *, schedules_active: bool) -> list[str]:
    """``prefect --no-prompt deploy --all``: from the project's prefect.yaml as it is (its
    schedules declare ``active: true``) with ``schedules_active``, else from a copy of it written
    into ``work_dir`` whose every schedule says ``active: false``."""
    command = [bin_path("prefect"), "--no-prompt", "deploy", "--all"]
    if schedules_active:
        return command
    paused = work_dir / "prefect-schedules-paused.yaml"
    write_paused_copy(project_dir / "prefect.yaml", paused)
    return [*command, "--prefect-file", str(paused)]


def deploy_all(
    project_dir: Path, env: dict[str, str], log_file: Path, *, schedules_active: bool
) -> None:
    """Deploy the project's prefect.yaml (an upsert) with :func:`deploy_command`: without
    ``schedules_active`` from the paused copy (beside the log), so no schedule is ever live on
    the server."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    command = deploy_command(project_dir, log_file.parent, schedules_active=schedules_active)
    with open(log_file, "ab") as out:
        proc = subprocess.run(
            command,
            cwd=project_dir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=600,
        )
    if proc.returncode != 0:
        tail = " | ".join(log_file.read_text(errors="replace").strip().splitlines()[-8:])
        raise RuntimeError(f"prefect deploy --all failed (exit {proc.returncode}): {tail}")


def write_paused_copy(prefect_yaml: Path, target: Path) -> int:
    """Copy ``prefect_yaml`` to ``target`` with every deployment schedule inactive; returns how
    many schedules it paused."""
    spec = yaml.safe_load(prefect_yaml.read_text())
    paused = 0
    for deployment in spec.get("deployments") or []:
        for schedule in deployment.get("schedules") or []:
            schedule["active"] = False
            paused += 1
    target.write_text(yaml.safe_dump(spec, sort_keys=False))
    return paused


def deployment_names(api_url: str) -> list[str]:
    """Every deployment on the server as ``flow/deployment``."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: api_url}), get_client(sync_client=True) as client:
        flows = {f.id: f.name for f in client.read_flows()}
        return sorted(f"{flows.get(d.flow_id, '?')}/{d.name}" for d in client.read_deployments())


REFRESH_DEPLOYMENT = "model-refresh/model-refresh"


def ensure_refresh_schedule(api_url: str, hours: float | None, *, active: bool = True) -> str:
    """Apply the safety-net setting to model-refresh's interval schedule: ``None`` leaves what
    prefect.yaml declares, 0 turns it off, else every ``hours`` hours (same anchor). Without
    ``active`` (a stack deployed with schedules paused) the interval is set but stays paused."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.schedules import IntervalSchedule
    from prefect.settings import PREFECT_API_URL, temporary_settings

    paused = "" if active else " (paused with the other schedules)"
    if hours is None:
        return f"refresh safety net: as prefect.yaml declares{paused}"
    with temporary_settings({PREFECT_API_URL: api_url}), get_client(sync_client=True) as client:
        deployment = client.read_deployment_by_name(REFRESH_DEPLOYMENT)
        for entry in deployment.schedules:
            current = entry.schedule
            if hours == 0:
                client.update_deployment_schedule(deployment.id, entry.id, active=False)
                continue
            if not isinstance(current, IntervalSchedule):
                continue
            client.update_deployment_schedule(
                deployment.id,
                entry.id,
                active=active,
                schedule=IntervalSchedule(
                    interval=dt.timedelta(hours=hours),
                    anchor_date=current.anchor_date,
                    timezone=current.timezone,
                ),
            )
    if hours == 0:
        return "refresh safety net: off"
    return f"refresh safety net: every {hours:g}h{paused}"


def refresh_triggers(api_url: str) -> list[str]:
    """The automations model-refresh's deployment triggers created, one line each."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: api_url}), get_client(sync_client=True) as client:
        deployment = client.read_deployment_by_name(REFRESH_DEPLOYMENT)
        owned = client.read_resource_related_automations(f"prefect.deployment.{deployment.id}")
    return sorted(f"{a.name} ({'on' if a.enabled else 'off'})" for a in owned)
