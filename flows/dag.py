"""The stage graph, declared once: stages, their home pool, what each reads, and the dispatch units.

The embedded executor runs these stages in this process, one subflow each; the deployed executor
runs the units with ``run_deployment`` on the pool the router picked (one process and one Spark
session per unit). ``prefect.yaml`` declares a deployment per stage on its home pool and one per
unit on each pool; a test checks it against this module.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, Literal, TypeVar

from pydantic import BaseModel

from infra.routing.pools import CPU_POOL, GPU_POOL
from infra.routing.router import StageWork, WorkloadKind
from infra.storage.store import ObjectStore
from tasks.reporting.records import (
    FeaturesResult,
    InferenceResult,
    PreprocessResult,
    TrainResult,
    ValidateResult,
    read_stage_manifest,
)

if TYPE_CHECKING:
    from prefect import Flow

R = TypeVar("R", bound=BaseModel)


@dataclass(frozen=True)
class Stage(Generic[R]):
    """One stage: its flow (name and ``prefect.yaml`` entrypoint), the pool it belongs on, the
    typed result it publishes as its manifest (``runs/<run_id>/<stage>.json``), its runner
    (``module.py:function`` in tasks/stages) and the stages whose results it reads: the flow
    hands them to the runner as keyword arguments named after those stages
    (:func:`upstream_results`), and ``after`` orders it behind stages it does not read."""

    name: str
    flow_name: str
    entrypoint: str
    pool: str
    kind: WorkloadKind
    scales_with: Literal["events", "customers"]
    result: type[R] = BaseModel  # type: ignore[assignment]
    runner: str = ""
    reads: tuple[str, ...] = ()
    after: tuple[str, ...] = ()

    @property
    def work(self) -> StageWork:
        """What the router needs to know about this stage."""
        return StageWork(stage=self.name, kind=self.kind, scales_with=self.scales_with)


@dataclass(frozen=True)
class DispatchUnit:
    """Stages that run as one flow run on one pool in deployed mode; ``routed_by`` is the stage
    whose routing decision places the whole unit."""

    flow_name: str
    entrypoint: str
    stages: tuple[Stage, ...]
    routed_by: str

    @property
    def pool(self) -> str:
        """The unit's home pool (all its stages share it)."""
        return self.stages[0].pool

    @property
    def stage_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.stages)

    def deployment_name(self, pool: str) -> str:
        """The unit's deployment on ``pool``: ``<flow>`` at home, ``<flow>-on-<pool>`` elsewhere."""
        return self.flow_name if pool == self.pool else f"{self.flow_name}-on-{pool}"

    def deployment_on(self, pool: str) -> str:
        """``<flow>/<deployment>`` as ``run_deployment`` wants it."""
        return f"{self.flow_name}/{self.deployment_name(pool)}"


VALIDATE = Stage(
    "validate",
    "validate",
    "flows/validate.py:validate_flow",
    CPU_POOL,
    WorkloadKind.PREPROCESSING,
    scales_with="events",
    result=ValidateResult,
    runner="tasks/stages/validate.py:validate_stage",
)
FEATURES = Stage(
    "features",
    "features",
    "flows/features.py:features_flow",
    CPU_POOL,
    WorkloadKind.FEATURE_ENGINEERING,
    scales_with="events",
    result=FeaturesResult,
    runner="tasks/stages/features.py:features_stage",
    reads=("validate",),
)
PREPROCESS = Stage(
    "preprocess",
    "preprocess",
    "flows/preprocess.py:preprocess_flow",
    CPU_POOL,
    WorkloadKind.PREPROCESSING,
    scales_with="customers",
    result=PreprocessResult,
    runner="tasks/stages/preprocess.py:preprocess_stage",
    reads=("features",),
)
TRAIN = Stage(
    "train",
    "train",
    "flows/train.py:train_flow",
    GPU_POOL,
    WorkloadKind.TRAINING,
    scales_with="customers",
    result=TrainResult,
    runner="tasks/stages/train.py:launch_training",
    reads=("features", "preprocess"),
)
BATCH_INFERENCE = Stage(
    "batch_inference",
    "batch-inference",
    "flows/batch_inference.py:batch_inference_flow",
    CPU_POOL,
    WorkloadKind.BATCH_INFERENCE,
    scales_with="customers",
    result=InferenceResult,
    runner="tasks/stages/batch_inference.py:batch_inference_stage",
    reads=("features",),
    after=("train",),  # it scores with production, which the train stage's gate may move
)
STAGES: tuple[Stage[BaseModel], ...] = (VALIDATE, FEATURES, PREPROCESS, TRAIN, BATCH_INFERENCE)
ROUTED_STAGES: tuple[StageWork, ...] = tuple(s.work for s in STAGES)
STAGE_KINDS: dict[str, WorkloadKind] = {s.name: s.kind for s in STAGES}

PREPARE_UNIT = DispatchUnit(
    "prepare-data",
    "flows/prepare.py:prepare_flow",
    (VALIDATE, FEATURES, PREPROCESS),
    routed_by="features",
)
TRAIN_UNIT = DispatchUnit("train", TRAIN.entrypoint, (TRAIN,), routed_by="train")
BATCH_INFERENCE_UNIT = DispatchUnit(
    "batch-inference", BATCH_INFERENCE.entrypoint, (BATCH_INFERENCE,), routed_by="batch_inference"
)
PIPELINE_UNITS: tuple[DispatchUnit, ...] = (PREPARE_UNIT, TRAIN_UNIT, BATCH_INFERENCE_UNIT)

# The train stage's contenders, one flow run per model family, all at once, between prepare-data
# and train (which reads what they published; a family without a published contender is fitted
# by the train stage itself). Each is routed on its own as stage ``contender-<family>``, sized by
# that family's cost hints and measured profiles; the deployment is ``contender`` on cpu-pool
# (tabular fits) and ``contender-on-gpu-pool``.
CONTENDER = Stage(
    "contender",
    "contender",
    "flows/contender.py:contender_flow",
    CPU_POOL,
    WorkloadKind.TRAINING,
    scales_with="customers",
    runner="tasks/stages/contenders.py:launch_contender",
    reads=("features", "preprocess"),
)
CONTENDER_UNIT = DispatchUnit(
    "contender", CONTENDER.entrypoint, (CONTENDER,), routed_by="contender"
)
UNITS_BEFORE_CONTENDERS: tuple[DispatchUnit, ...] = (PREPARE_UNIT,)
UNITS_AFTER_CONTENDERS: tuple[DispatchUnit, ...] = (TRAIN_UNIT, BATCH_INFERENCE_UNIT)


def units_through(stage_name: str) -> tuple[DispatchUnit, ...]:
    """The pipeline's units up to and including the one that runs ``stage_name``."""
    for i, unit in enumerate(PIPELINE_UNITS):
        if stage_name in unit.stage_names:
            return PIPELINE_UNITS[: i + 1]
    raise KeyError(stage_name)


# a model refresh: the graph's prepare -> train slice (the train stage applies the gate)
REFRESH_UNITS: tuple[DispatchUnit, ...] = units_through(TRAIN.name)


def routed_stages(units: tuple[DispatchUnit, ...]) -> tuple[StageWork, ...]:
    """What the router sizes and places for ``units``: each of their stages' work."""
    return tuple(stage.work for unit in units for stage in unit.stages)


def home_pools(units: tuple[DispatchUnit, ...]) -> dict[str, str]:
    """Each unit on the pool its stages belong on (what a run without a routing plan uses)."""
    return {unit.flow_name: unit.pool for unit in units}


def load_flow(entrypoint: str) -> Flow:
    """The flow object at ``path/to/module.py:attribute``, imported on first use (so a CPU
    worker running prepare-data never imports torch for the train flow)."""
    path, _, attribute = entrypoint.partition(":")
    module = importlib.import_module(path.removesuffix(".py").replace("/", "."))
    return getattr(module, attribute)


def stage(name: str) -> Stage:
    """The stage called ``name``; KeyError for an unknown one."""
    for s in STAGES:
        if s.name == name:
            return s
    raise KeyError(name)


def pool_of(stage_name: str) -> str:
    """The home pool of a stage."""
    return stage(stage_name).pool


def stage_result(store: ObjectStore, run_id: str, of: Stage[R]) -> R:
    """The published result of stage ``of`` in run ``run_id``, as the graph types it."""
    return read_stage_manifest(store, run_id, of.name, of.result)


def upstream_results(store: ObjectStore, run_id: str, of: Stage[BaseModel]) -> dict[str, BaseModel]:
    """What stage ``of`` reads, by stage name: the typed results of the stages its ``reads``
    declares, which its runner takes as keyword arguments of those names."""
    return {name: stage_result(store, run_id, stage(name)) for name in of.reads}


def run_results(
    store: ObjectStore, run_id: str, stages: tuple[Stage[BaseModel], ...] = STAGES
) -> dict[str, BaseModel]:
    """Every result a run published for ``stages``, by stage name (what its summary reads)."""
    return {s.name: stage_result(store, run_id, s) for s in stages}
