"""Which engine runs a CPU stage: the one rule table, decided once per stage run.

Plain Python, no engine imported: the stage runners call :func:`choose_engine` once and put its
answer (engine and reason) on their report, and ``hybridflow run`` calls it before any flow to
know whether to start the JVM early (:func:`run_needs_spark`). The rules, in order:

1. the input's layout needs Spark (CSV, column types only Spark parses): ``spark``;
2. on a cluster, a stage that must run on its executors (batch inference scores in Python
   workers there): ``spark``;
3. up to ``limit`` rows (``HYBRIDFLOW_IN_PROCESS_ROWS``, or a caller's override; ``0``: always
   Spark): ``in-process`` (DuckDB, pyarrow, numpy in the flow's process);
4. above it, a stage that runs its SQL in DuckDB inside Spark tasks (features): on input
   clustered by customer, a task per bucket (``spark-per-bucket``); else one shuffle by
   customer and a task per partition (``spark-per-partition``: events an S3 store's executors
   wrote on a cluster carry no bucket layout); other stages: ``spark``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

Engine = Literal["in-process", "spark", "spark-per-bucket", "spark-per-partition"]
IN_PROCESS: Engine = "in-process"
SPARK: Engine = "spark"
SPARK_PER_BUCKET: Engine = "spark-per-bucket"
SPARK_PER_PARTITION: Engine = "spark-per-partition"

# stages that, on a cluster, run on its executors whatever the size
CLUSTER_ONLY = frozenset({"batch_inference"})
# stages whose Spark tasks run DuckDB over all events of their customers: a task per bucket of
# input clustered by customer, else a task per partition after one shuffle by customer
PER_CUSTOMER_TASKS = frozenset({"features"})
# the CPU stages of a pipeline run (what run_needs_spark asks about)
CPU_STAGES = ("validate", "features", "preprocess", "batch_inference")


class EngineInputs(BaseModel):
    """What the choice looks at: the input's rows and layout, where Spark runs, the limit."""

    rows: int
    limit: int
    rows_estimated: bool = False  # ``rows`` from the files' sizes (CSV), not counted
    cluster: bool = False
    layout_problem: str | None = None  # why this input needs Spark (None: any engine reads it)
    clustered_by_customer: bool = False


class EngineChoice(BaseModel):
    """A stage's engine and why, as the stage report shows it."""

    engine: Engine
    reason: str


def choose_engine(stage: str, inputs: EngineInputs) -> EngineChoice:
    """The engine for ``stage`` on ``inputs`` (the module's rules, in order)."""
    if inputs.layout_problem is not None:
        return EngineChoice(engine=SPARK, reason=inputs.layout_problem)
    if inputs.cluster and stage in CLUSTER_ONLY:
        return EngineChoice(engine=SPARK, reason="on a cluster: scored by its executors")
    rows = f"{'about ' if inputs.rows_estimated else ''}{inputs.rows:,} rows"
    if inputs.rows <= inputs.limit:
        return EngineChoice(
            engine=IN_PROCESS, reason=f"{rows} <= in-process limit {inputs.limit:,}"
        )
    over = f"{rows} > in-process limit {inputs.limit:,}"
    if stage not in PER_CUSTOMER_TASKS:
        return EngineChoice(engine=SPARK, reason=over)
    if inputs.clustered_by_customer:
        return EngineChoice(engine=SPARK_PER_BUCKET, reason=f"{over}; clustered by customer")
    where = "on a cluster" if inputs.cluster else "in local mode"
    return EngineChoice(
        engine=SPARK_PER_PARTITION,
        reason=f"{over}; not clustered by customer ({where}): one shuffle by customer, then "
        "DuckDB per partition",
    )


def run_needs_spark(inputs: EngineInputs) -> bool:
    """Whether any CPU stage of a run whose largest input is ``inputs`` (the events) runs on
    Spark: what ``hybridflow run`` asks before starting the JVM early."""
    return any(choose_engine(stage, inputs).engine != IN_PROCESS for stage in CPU_STAGES)
