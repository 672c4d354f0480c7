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
    """One dispatch unit: the stage manifests it publishes and its deployment on each pool
    (every unit is routable: the router may send it to either pool)."""

    deployment: str
    stages: tuple[str, ...]
    other_pool_deployment: str = ""

    @property
    def pool(self) -> str:
        """The pool the unit's stages belong to by default (one pool per unit)."""
        return POOL_BY_STAGE[self.stages[0]]

    @property
    def routed_by(self) -> str:
        """The stage whose routing decision places the whole unit."""
        return "features" if "features" in self.stages else self.stages[0]

    def deployment_on(self, pool: str) -> str:
        """The unit's deployment on ``pool``."""
        if pool == self.pool:
            return self.deployment
        if not self.other_pool_deployment:
            raise StageRunFailed(f"{self.deployment} has no deployment on {pool}")
        return self.other_pool_deployment


# validate/features/preprocess run as one unit: one process and one Spark session instead of three
PREPARE = DeployedStage(
    "prepare-data/prepare-data",
    ("validate", "features", "preprocess"),
    "prepare-data/prepare-data-on-gpu-pool",
)
TRAIN = DeployedStage("train/train", ("train",), "train/train-on-cpu-pool")
BATCH_INFERENCE = DeployedStage(
    "batch-inference/batch-inference",
    ("batch_inference",),
    "batch-inference/batch-inference-on-gpu-pool",
)
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
    pool: str,
    params: BaseModel,
    store: ObjectStore,
    run_id: str,
    poll_s: float,
) -> StageOrigin:
    """Skip the unit when its manifests exist, else run its deployment on ``pool`` and wait."""
    deployment_name = unit.deployment_on(pool)
    if is_complete(store, run_id, unit):
        log.info("%s: manifests of run %s complete, not run again", deployment_name, run_id)
        return StageOrigin(pool=pool, cached=True)
    log.info("%s: dispatching to %s", deployment_name, pool)
    try:
        child = run_deployment(
            deployment_name,
            parameters={"params": params.model_dump(mode="json")},
            poll_interval=poll_s,
            as_subflow=True,
        )
    except ObjectNotFound:
        raise StageRunFailed(
            f"deployment {deployment_name!r} not found: deploy prefect.yaml first "
            "(hybridflow up, or prefect --no-prompt deploy --all)"
        ) from None
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
    return StageOrigin(pool=pool, cached=False, flow_run_id=str(child.id))


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
