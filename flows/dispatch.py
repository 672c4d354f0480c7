"""Deployed mode: each stage runs as its deployment on its pool; only store URIs are handed over.

The pipeline calls :func:`run_or_reuse` per dispatch unit. A unit whose manifests are all in the
store under the run key is not run again (a manifest is the last thing a stage writes, so one
that exists is complete); otherwise it is started with ``run_deployment`` as a subflow (the UI
shows the tree) and a child that does not complete fails the pipeline with its error and a link.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal

from prefect.deployments import run_deployment
from prefect.exceptions import ObjectNotFound
from prefect.runtime import deployment
from pydantic import BaseModel

from flows._glue import POOL_BY_STAGE
from infra.store import ObjectStore
from tasks.stage_records import stage_key

log = logging.getLogger(__name__)


class StageRunFailed(RuntimeError):
    """A stage's flow run ended in a state other than Completed."""


@dataclass(frozen=True)
class DeployedStage:
    """One dispatch unit: a deployment and the stage manifests it publishes."""

    deployment: str
    stages: tuple[str, ...]

    @property
    def pool(self) -> str:
        """The pool the unit's stages belong to (one pool per unit)."""
        return POOL_BY_STAGE[self.stages[0]]


# validate/features/preprocess run as one unit: one process and one Spark session instead of three
PREPARE = DeployedStage("prepare-data/prepare-data", ("validate", "features", "preprocess"))
TRAIN = DeployedStage("train/train", ("train",))
BATCH_INFERENCE = DeployedStage("batch-inference/batch-inference", ("batch_inference",))
DEPLOYED_DAG: tuple[DeployedStage, ...] = (PREPARE, TRAIN, BATCH_INFERENCE)


@dataclass(frozen=True)
class StageOrigin:
    """Where a unit's outputs came from in this pipeline run."""

    pool: str
    cached: bool
    flow_run_id: str | None = None


def dispatch_mode(requested: str) -> Literal["embedded", "deployed"]:
    """``auto``: deployed inside a deployment run (a worker started it), embedded otherwise."""
    if requested == "embedded" or requested == "deployed":
        return requested
    return "deployed" if deployment.get_id() else "embedded"


def is_complete(store: ObjectStore, run_id: str, unit: DeployedStage) -> bool:
    """True when every manifest the unit publishes exists for ``run_id``."""
    return all(store.exists(stage_key(run_id, stage)) for stage in unit.stages)


def flow_run_link(flow_run_id: object) -> str:
    """The UI page of a flow run (the API address when no UI address is configured)."""
    from prefect.settings import PREFECT_API_URL, PREFECT_UI_URL

    base = PREFECT_UI_URL.value() or (PREFECT_API_URL.value() or "").removesuffix("/api")
    return f"{base}/runs/flow-run/{flow_run_id}"


def run_or_reuse(
    unit: DeployedStage,
    params: BaseModel,
    store: ObjectStore,
    run_id: str,
    poll_s: float,
) -> StageOrigin:
    """Skip the unit when its manifests exist, else run its deployment and wait for it."""
    if is_complete(store, run_id, unit):
        log.info("%s: manifests of run %s complete, not run again", unit.deployment, run_id)
        return StageOrigin(pool=unit.pool, cached=True)
    log.info("%s: dispatching to %s", unit.deployment, unit.pool)
    try:
        child = run_deployment(
            unit.deployment,
            parameters={"params": params.model_dump(mode="json")},
            poll_interval=poll_s,
            as_subflow=True,
        )
    except ObjectNotFound:
        raise StageRunFailed(
            f"deployment {unit.deployment!r} not found: deploy prefect.yaml first "
            "(hybridflow up, or prefect --no-prompt deploy --all)"
        ) from None
    state = child.state
    if state is None or not state.is_completed():
        name = state.name if state else "unknown"
        message = (state.message if state else None) or "no message"
        raise StageRunFailed(
            f"stage {unit.deployment} (flow run {child.name}) ended {name}: {message} "
            f"-> {flow_run_link(child.id)}"
        )
    pool = child.work_pool_name or unit.pool
    log.info("%s: completed on %s (flow run %s)", unit.deployment, pool, child.name)
    return StageOrigin(pool=pool, cached=False, flow_run_id=str(child.id))
