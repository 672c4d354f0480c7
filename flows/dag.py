"""The stage graph, declared once: stages, their home pool, what each reads, and the dispatch units.

The embedded executor runs these stages in this process, one subflow each; the deployed executor
runs the units with ``run_deployment`` on the pool the router picked (one process and one Spark
session per unit). ``prefect.yaml`` declares a deployment per stage on its home pool and one per
unit on each pool; a test checks it against this module.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from infra.routing.router import StageWork, WorkloadKind

if TYPE_CHECKING:
    from prefect import Flow

CPU_POOL = "cpu-pool"
GPU_POOL = "gpu-pool"
POOLS = (CPU_POOL, GPU_POOL)


@dataclass(frozen=True)
class Stage:
    """One stage: its flow (name and ``prefect.yaml`` entrypoint), the pool it belongs on, and
    the stages whose manifests it reads (``runs/<run_id>/<stage>.json``)."""

    name: str
    flow_name: str
    entrypoint: str
    pool: str
    kind: WorkloadKind
    scales_with: Literal["events", "customers"]
    reads: tuple[str, ...] = ()

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
)
FEATURES = Stage(
    "features",
    "features",
    "flows/features.py:features_flow",
    CPU_POOL,
    WorkloadKind.FEATURE_ENGINEERING,
    scales_with="events",
    reads=("validate",),
)
PREPROCESS = Stage(
    "preprocess",
    "preprocess",
    "flows/preprocess.py:preprocess_flow",
    CPU_POOL,
    WorkloadKind.PREPROCESSING,
    scales_with="customers",
    reads=("features",),
)
TRAIN = Stage(
    "train",
    "train",
    "flows/train.py:train_flow",
    GPU_POOL,
    WorkloadKind.TRAINING,
    scales_with="customers",
    reads=("features", "preprocess"),
)
BATCH_INFERENCE = Stage(
    "batch_inference",
    "batch-inference",
    "flows/batch_inference.py:batch_inference_flow",
    CPU_POOL,
    WorkloadKind.BATCH_INFERENCE,
    scales_with="customers",
    reads=("features", "train"),
)
STAGES: tuple[Stage, ...] = (VALIDATE, FEATURES, PREPROCESS, TRAIN, BATCH_INFERENCE)
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
    reads=("features", "preprocess"),
)
CONTENDER_UNIT = DispatchUnit(
    "contender", CONTENDER.entrypoint, (CONTENDER,), routed_by="contender"
)
UNITS_BEFORE_CONTENDERS: tuple[DispatchUnit, ...] = (PREPARE_UNIT,)
UNITS_AFTER_CONTENDERS: tuple[DispatchUnit, ...] = (TRAIN_UNIT, BATCH_INFERENCE_UNIT)


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
