"""Where a flow runs: its run id, the work pool under it, and how a stage records its result."""

from __future__ import annotations

import os
import threading
import uuid
from contextvars import ContextVar
from functools import lru_cache
from typing import TypeVar

from prefect.context import FlowRunContext
from prefect.runtime import flow_run
from pydantic import BaseModel

from infra.routing.accounting import embedded_pool, peak_memory_mb
from infra.storage.store import ObjectStore
from tasks.reporting.records import write_stage_manifest

R = TypeVar("R", bound=BaseModel)

# set by a runner that starts a subflow on another thread: the subflow's body sets it once it
# began (Prefect has created its flow run by then)
_began: ContextVar[threading.Event | None] = ContextVar("hybridflow_unit_began", default=None)


def unit_began() -> None:
    """Called first in a unit's flow body: tells a runner waiting to start the next unit on
    another thread that this one's flow run exists (see flows.executors)."""
    event = _began.get()
    if event is not None:
        event.set()


def began_event() -> threading.Event:
    """A fresh event that :func:`unit_began` sets in this context (call it in the context the
    subflow runs in)."""
    event = threading.Event()
    _began.set(event)
    return event


def resolve_run_id(explicit: str | None) -> str:
    """The pipeline run id handed down, else this flow run's id."""
    if explicit:
        return explicit
    current = flow_run.get_id()
    return str(current) if current else uuid.uuid4().hex


@lru_cache(maxsize=1)
def _process_flow_run_pool(flow_run_id: str) -> str | None:
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return client.read_flow_run(uuid.UUID(flow_run_id)).work_pool_name


def current_pool(default: str = "embedded") -> str:
    """The work pool running this flow: its own run's pool, else (an in-process subflow) the pool
    of the deployment run that started this process, else ``default``."""
    ctx = FlowRunContext.get()
    if ctx and ctx.flow_run and ctx.flow_run.work_pool_name:
        return ctx.flow_run.work_pool_name
    if os.environ.get("HYBRIDFLOW_POOL"):
        return os.environ["HYBRIDFLOW_POOL"]
    process_run = os.environ.get("PREFECT__FLOW_RUN_ID")
    return (_process_flow_run_pool(process_run) if process_run else None) or default


def record_stage_result(store: ObjectStore, run_id: str | None, stage: str, result: R) -> R:
    """Stamp where the stage ran (pool, peak memory of this process) on its report and, inside a
    pipeline run, publish it as the stage's manifest (the last thing a stage writes)."""
    report = result.report  # type: ignore[attr-defined]
    stamped = report.model_copy(
        update={
            "pool": current_pool(embedded_pool(report.device)),
            "peak_memory_mb": peak_memory_mb(),
        }
    )
    result = result.model_copy(update={"report": stamped})
    if run_id:
        write_stage_manifest(store, run_id, stage, result)
    return result
