"""The two ways to run the stage graph of :mod:`flows.dag`.

Embedded: every stage runs in this process as a subflow, in graph order.
Deployed: every dispatch unit runs as its deployment on the pool the router chose, started with
``run_deployment`` as a subflow (the UI shows the tree); only store URIs are handed over. The
train stage's contenders (one unit per model family) are all started before any is waited for,
so they run side by side on their pools. A unit
whose manifests all exist under the run key is not run again (a manifest is the last thing a
stage writes, so one that exists is complete), and a child that does not complete fails the
pipeline with its state, its message and a link to it. A child that no worker picks up within
``dispatch_start_timeout_seconds`` (a pool without a worker, a paused or saturated pool) is
cancelled and fails the pipeline with what the pool looks like; once started, a child may run
as long as it needs (a dead worker is caught by the stack's heartbeat automation).
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from dataclasses import dataclass
from typing import Literal
from uuid import UUID

from prefect import Flow
from prefect.client.orchestration import get_client
from prefect.client.schemas.objects import FlowRun, StateType
from prefect.deployments import run_deployment
from prefect.exceptions import ObjectNotFound
from prefect.runtime import deployment
from prefect.states import Cancelled

from flows.context import began_event
from flows.dag import CONTENDER, CONTENDER_UNIT, PIPELINE_UNITS, DispatchUnit, load_flow
from flows.params import DevicePreference, StageParams
from infra import startup
from infra.layout import stage_manifest_key
from infra.routing.planner import RoutingPlan
from infra.routing.pools import CPU_POOL
from infra.settings import HybridflowSettings
from infra.storage.store import ObjectStore
from tasks.reporting.records import contender_stage

log = logging.getLogger(__name__)


class StageRunFailed(RuntimeError):
    """A stage's flow run ended in a state other than Completed."""


@dataclass(frozen=True)
class UnitOrigin:
    """Where a unit's outputs came from in this run: its pool (None: this process), whether an
    earlier attempt under the same run key had published them, and the child flow run."""

    pool: str | None
    cached: bool = False
    flow_run_id: str | None = None


def routed_device(device: DevicePreference, plan: RoutingPlan) -> DevicePreference:
    """The train stage's device: as asked, but the CPU when the router sent training there."""
    return "cpu" if device == "auto" and plan.pool_for("train") == CPU_POOL else device


def unit_pools(
    plan: RoutingPlan, units: tuple[DispatchUnit, ...] = PIPELINE_UNITS
) -> dict[str, str]:
    """The pool each dispatch unit of ``units`` runs on: the plan's choice for the stage that
    routes it (the pipeline's units, or a refresh's slice of them)."""
    return {unit.flow_name: plan.pool_for(unit.routed_by) for unit in units}


def dispatch_mode(requested: str) -> Literal["embedded", "deployed"]:
    """``auto``: deployed inside a deployment run (a worker started it), embedded otherwise."""
    if requested == "embedded" or requested == "deployed":
        return requested
    return "deployed" if deployment.get_id() else "embedded"


def run_in_process(
    params: StageParams, units: tuple[DispatchUnit, ...] = PIPELINE_UNITS
) -> dict[str, UnitOrigin]:
    """Run every stage of ``units`` here, one subflow each, in graph order."""
    startup.mark("first_stage")
    for unit in units:
        for stage in unit.stages:
            load_flow(stage.entrypoint)(params)
    return {unit.flow_name: UnitOrigin(pool=None) for unit in units}


def run_on_pools(
    params: StageParams,
    pools: dict[str, str],
    store: ObjectStore,
    settings: HybridflowSettings,
    units: tuple[DispatchUnit, ...] = PIPELINE_UNITS,
) -> dict[str, UnitOrigin]:
    """Run each unit as its deployment on ``pools[unit.flow_name]`` and wait for it."""
    assert params.run_id, "deployed runs hand over manifests under an explicit run key"
    startup.mark("first_stage")
    timing = DispatchTiming(
        poll_s=settings.dispatch_poll_seconds,
        start_timeout_s=settings.dispatch_start_timeout_seconds,
    )
    return {
        unit.flow_name: run_or_reuse(unit, pools[unit.flow_name], params, store, timing)
        for unit in units
    }


@dataclass(frozen=True)
class DispatchTiming:
    """How often a dispatched child is polled, and how long it may wait for a worker."""

    poll_s: float
    start_timeout_s: float


def is_complete(store: ObjectStore, run_id: str, unit: DispatchUnit) -> bool:
    """True when every manifest the unit publishes exists for ``run_id``."""
    return all(store.exists(stage_manifest_key(run_id, s)) for s in unit.stage_names)


def flow_run_link(flow_run_id: object) -> str:
    """The UI page of a flow run (the API address when no UI address is configured)."""
    from prefect.settings import PREFECT_API_URL, PREFECT_UI_URL

    base = PREFECT_UI_URL.value() or (PREFECT_API_URL.value() or "").removesuffix("/api")
    return f"{base}/runs/flow-run/{flow_run_id}"


def run_or_reuse(
    unit: DispatchUnit,
    pool: str,
    params: StageParams,
    store: ObjectStore,
    timing: DispatchTiming,
) -> UnitOrigin:
    """Skip the unit when its manifests exist, else run its deployment on ``pool`` and wait."""
    if is_complete(store, params.run_id or "", unit):
        log.info(
            "%s: manifests of run %s complete, not run again",
            unit.deployment_on(pool),
            params.run_id,
        )
        return UnitOrigin(pool=pool, cached=True)
    return finish_unit(start_unit(unit, pool, params), timing)


@dataclass(frozen=True)
class StartedUnit:
    """A unit's flow run, created on its pool and not waited for yet."""

    deployment_name: str
    pool: str
    flow_run_id: UUID


def start_unit(
    unit: DispatchUnit, pool: str, params: StageParams, flow_run_name: str | None = None
) -> StartedUnit:
    """Create the unit's flow run on ``pool`` as a subflow of this run (not waited for)."""
    deployment_name = unit.deployment_on(pool)
    log.info("%s: dispatching to %s", deployment_name, pool)
    try:
        created = run_deployment(
            deployment_name,
            parameters={"params": params.model_dump(mode="json")},
            as_subflow=True,
            timeout=0,  # waited for in finish_unit, with a deadline for a worker to pick it up
            flow_run_name=flow_run_name,
        )
    except ObjectNotFound:
        raise StageRunFailed(
            f"deployment {deployment_name!r} not found: deploy prefect.yaml first "
            "(hybridflow up, or prefect --no-prompt deploy --all)"
        ) from None
    return StartedUnit(deployment_name, pool, created.id)


def finish_unit(started: StartedUnit, timing: DispatchTiming) -> UnitOrigin:
    """Wait for a started unit; StageRunFailed when it does not complete."""
    deployment_name, pool = started.deployment_name, started.pool
    child = wait_for_child(started.flow_run_id, deployment_name, pool, timing)
    state = child.state
    if state is None or not state.is_completed():
        name = state.name if state else "unknown"
        message = (state.message if state else None) or "no message"
        raise StageRunFailed(
            f"stage {deployment_name} (flow run {child.name}) ended {name}: {message} "
            f"-> {flow_run_link(child.id)}"
        )
    pool = child.work_pool_name or pool
    log.info("%s: completed on %s (flow run %s)", deployment_name, pool, child.name)
    return UnitOrigin(pool=pool, cached=False, flow_run_id=str(child.id))


def run_contenders_in_process(
    contenders: dict[str, StageParams], at_once: int = 1
) -> dict[str, UnitOrigin]:
    """Each family's contender unit here, one subflow each (``contenders``: family -> its
    parameters, ``families`` naming it); ``at_once`` > 1: that many at the same time, each on a
    thread of its own (:func:`tasks.policy.contending.contenders_at_once`). They share what
    they decode of the run's snapshots (:func:`tasks.ml.snapshot_reader.shared_reads`), which
    is dropped before the stages after them."""
    from tasks.ml.snapshot_reader import shared_reads

    contender = load_flow(CONTENDER.entrypoint)
    with shared_reads():
        if at_once <= 1 or len(contenders) <= 1:
            for params in contenders.values():
                contender(params)
        else:
            run_subflows_at_once(contender, list(contenders.values()), at_once)
    return {family: UnitOrigin(pool=None) for family in contenders}


def run_subflows_at_once(subflow: Flow, params: list[StageParams], at_once: int) -> None:
    """``subflow(p)`` for each of ``params``, up to ``at_once`` at a time on threads, in this
    flow run's context. Each starts once the one before it began (its flow run created), so
    Prefect numbers the subflows' parent task runs in the same order as one after another (two
    created at the same moment could get one number: the second would be taken for the first's
    flow run). The first failure is raised once every started one has ended."""
    slots = threading.Semaphore(at_once)
    failures: list[BaseException] = []

    def one(p: StageParams, began: threading.Event) -> None:
        try:
            subflow(p)
        except BaseException as exc:  # raised below, in the pipeline's thread
            failures.append(exc)
        finally:
            began.set()
            slots.release()

    threads = []
    for p in params:
        slots.acquire()
        if failures:
            slots.release()
            break
        context = contextvars.copy_context()
        began = context.run(began_event)
        thread = threading.Thread(target=context.run, args=(one, p, began), daemon=True)
        thread.start()
        threads.append(thread)
        began.wait()
    for thread in threads:
        thread.join()
    if failures:
        raise failures[0]


def run_contenders_on_pools(
    contenders: dict[str, tuple[str, StageParams]],
    store: ObjectStore,
    settings: HybridflowSettings,
) -> dict[str, UnitOrigin]:
    """Start every family's contender unit on its pool (``contenders``: family -> (pool, its
    parameters)), then wait for them all: they run at the same time. A family whose contender
    an earlier attempt under the run key published is not run again; every failure is named."""
    timing = DispatchTiming(
        poll_s=settings.dispatch_poll_seconds,
        start_timeout_s=settings.dispatch_start_timeout_seconds,
    )
    origins: dict[str, UnitOrigin] = {}
    started: dict[str, StartedUnit] = {}
    for family, (pool, params) in contenders.items():
        assert params.run_id, "deployed runs hand over manifests under an explicit run key"
        if store.exists(stage_manifest_key(params.run_id, contender_stage(family))):
            log.info(
                "contender %s of run %s published before, not run again", family, params.run_id
            )
            origins[family] = UnitOrigin(pool=pool, cached=True)
            continue
        started[family] = start_unit(
            CONTENDER_UNIT, pool, params, flow_run_name=f"{contender_stage(family)}-{params.run_id}"
        )
    failures = []
    for family, unit in started.items():
        try:
            origins[family] = finish_unit(unit, timing)
        except StageRunFailed as exc:
            failures.append(str(exc))
    if failures:
        raise StageRunFailed("; ".join(failures))
    return origins


def wait_for_child(
    flow_run_id: UUID, deployment_name: str, pool: str, timing: DispatchTiming
) -> FlowRun:
    """Poll the child until it is final; cancel it and raise StageRunFailed when no worker has
    picked it up within ``timing.start_timeout_s``."""
    deadline = time.monotonic() + timing.start_timeout_s
    with get_client(sync_client=True) as client:
        while True:
            child = client.read_flow_run(flow_run_id)
            state_type = child.state.type if child.state else None
            if child.state is not None and child.state.is_final():
                return child
            if state_type == StateType.SCHEDULED and time.monotonic() > deadline:
                why = _pool_condition(client, pool)
                message = (
                    f"no worker picked it up within {timing.start_timeout_s:g}s: {why}; "
                    "cancelled by the pipeline"
                )
                client.set_flow_run_state(flow_run_id, Cancelled(message=message), force=True)
                raise StageRunFailed(
                    f"stage {deployment_name} (flow run {child.name}) {message} "
                    f"-> {flow_run_link(flow_run_id)}"
                )
            time.sleep(timing.poll_s)


def _pool_condition(client, pool: str) -> str:
    """Why a pool may not be picking up runs: no online worker, paused, or full."""
    try:
        work_pool = client.read_work_pool(pool)
    except ObjectNotFound:
        return f"work pool {pool} does not exist"
    online = [w for w in client.read_workers_for_work_pool(pool) if w.status == "ONLINE"]
    if work_pool.is_paused:
        return f"work pool {pool} is paused"
    if not online:
        return (
            f"work pool {pool} has no online worker (start one: hybridflow up, or "
            f"prefect worker start --pool {pool})"
        )
    limit = work_pool.concurrency_limit
    return f"work pool {pool} has {len(online)} online worker(s) (concurrency limit {limit})"


def schedule_profiling_runs(pools: list[str], parameters: dict[str, object]) -> list[str]:
    """Start (without waiting) a short profiling run on each pool that has no profile yet."""
    started = []
    for pool in pools:
        name = f"profile/profile-on-{pool}"
        try:
            child = run_deployment(name, parameters={"params": parameters}, timeout=0)
        except ObjectNotFound:
            log.warning("no %s deployment: deploy prefect.yaml to profile %s", name, pool)
            continue
        log.info("scheduled profiling run %s on %s", child.name, pool)
        started.append(str(child.id))
    return started
