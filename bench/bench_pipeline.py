"""Pipeline overhead and scaling: the whole embedded pipeline at 1x, 4x and 16x the data.

* Overhead: wall time of ``pipeline_flow`` vs the sum of its stages' own compute time
  (``StageReport.seconds``); the rest is orchestration (flow/subflow runs, artifacts), Spark
  session look-ups and hand-offs through the store. Spark's JVM start and Prefect's temporary
  API start are measured once, up front, and reported on their own rows.
* Prefect's floor: a flow with as many empty subflows and one-row artifacts as the 1x run made
  (read back from the API), measured in the same process. It is what any pipeline of this shape
  pays on this API, whatever its stages do; ``beyond_floor_pct`` is the overhead left above it.
* Scaling: total time per size, next to each stage's seconds, so a stage whose time does not
  grow with the data (fixed cost: task scheduling, Python workers) stands out from one that does.
* CPU: CPU seconds of this process tree (driver, JVM, Python workers) / (wall x cores).

``HYBRIDFLOW_BENCH_PIPELINE_CUSTOMERS`` sets 1x (default 1,500 customers, ~32k events).
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from bench._proc import tree_cpu_seconds

SIZES = (1, 4, 16)
STAGES = ("validate", "features", "preprocess", "train", "batch_inference")


def _warm_up_prefect() -> float:
    from prefect import flow

    @flow(name="bench-warm-up")
    def warm_up() -> int:
        return 1

    started = time.perf_counter()
    warm_up()
    return time.perf_counter() - started


def _run_shape(pipeline_run_id: str) -> tuple[int, int]:
    """Subflows and artifacts of a pipeline flow run (its own and its subflows'), from the API."""
    from uuid import UUID

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        ArtifactFilter,
        ArtifactFilterFlowRunId,
        FlowRunFilter,
        FlowRunFilterParentFlowRunId,
    )

    parent = UUID(pipeline_run_id)
    with get_client(sync_client=True) as client:
        children = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(
                parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[parent])
            )
        )
        runs = [parent, *(c.id for c in children)]
        artifacts = client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=runs))
        )
    return len(children), len(artifacts)


def _prefect_floor(subflows: int, artifacts: int, repeats: int = 3) -> float:
    """Median seconds of a flow with ``subflows`` empty subflows and ``artifacts`` one-row table
    artifacts: Prefect's own cost of a run of that shape on this API."""
    from prefect import flow
    from prefect.artifacts import create_table_artifact

    @flow(name="bench-floor-stage")
    def empty_stage() -> None:
        return None

    @flow(name="bench-floor-pipeline")
    def empty_pipeline() -> None:
        for _ in range(subflows):
            empty_stage()
        for i in range(artifacts):
            create_table_artifact(table=[{"metric": "i", "value": i}], key=f"bench-floor-{i}")

    empty_pipeline()  # registers the flows
    seconds = []
    for _ in range(repeats):
        started = time.perf_counter()
        empty_pipeline()
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds)


def _run_sizes(base: int, work: Path) -> tuple[list[tuple], float, float, bool]:
    """The pipeline at every size (events, summary, wall and CPU seconds per size), after
    Prefect's and the JVM's one-off starts (their seconds; whether the JVM was up already)."""
    from pyspark.sql import SparkSession

    from flows.pipeline import PipelineParams, pipeline_flow
    from infra.compute.spark import get_spark
    from infra.settings import get_settings
    from tasks.data.demo_events import DemoDataParams, generate_demo_events

    try:
        prefect_start = _warm_up_prefect()
        jvm_was_up = SparkSession.getActiveSession() is not None
        started = time.perf_counter()
        get_spark(get_settings())
        jvm_start = time.perf_counter() - started
        runs = []
        for k in SIZES:
            events = generate_demo_events(
                DemoDataParams(customers=base * k, seed=100 + k), work / f"events-{k}x"
            )
            cpu_before, started = tree_cpu_seconds(), time.perf_counter()
            summary = pipeline_flow(
                PipelineParams(
                    events=str(work / f"events-{k}x"),
                    store=str(work / f"store-{k}x"),
                    device="cpu",
                )
            )
            wall = time.perf_counter() - started
            cpu = tree_cpu_seconds() - cpu_before
            runs.append((k, events.events, summary, wall, cpu))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return runs, prefect_start, jvm_start, jvm_was_up


def main(results_dir: Path) -> list[dict]:
    """Run the pipeline at each size on fresh stores; rows for overhead and scaling."""
    from infra.prefect_runtime.env import heartbeats_only_for_a_server

    base = int(os.environ.get("HYBRIDFLOW_BENCH_PIPELINE_CUSTOMERS", "1500"))
    cores = os.cpu_count() or 1
    work = Path(tempfile.mkdtemp(prefix="hf-bench-pipeline-"))
    rows: list[dict] = []
    # as `hybridflow run` runs it: no flow-run heartbeats without a server (each flow run's
    # end would wait up to 1 s for the heartbeat thread)
    with heartbeats_only_for_a_server():
        runs, prefect_start, jvm_start, jvm_was_up = _run_sizes(base, work)
        subflows, artifacts = _run_shape(runs[0][2].run_id)
        floor_s = _prefect_floor(subflows, artifacts)
    for k, n_events, summary, wall, cpu in runs:
        stage_sum = sum(s.seconds for s in summary.stages)
        rows.append(
            {
                "benchmark": "pipeline_overhead",
                "subject": f"pipeline wall, {k}x ({base * k:,} customers, {n_events:,} events)",
                "baseline": "sum of stage compute",
                "ratio": wall / stage_sum,
                "seconds": wall,
                "stage_seconds": stage_sum,
                "overhead_pct": 100.0 * (wall - stage_sum) / wall,
                "prefect_floor_s": floor_s,
                "beyond_floor_pct": 100.0 * (wall - stage_sum - floor_s) / wall,
                "cpu_util_pct": 100.0 * cpu / (wall * cores),
            }
        )
    wall_1x = runs[0][3]
    for k, n_events, summary, wall, _cpu in runs:
        by_stage = {s.name: s.seconds for s in summary.stages}
        rows.append(
            {
                "benchmark": "pipeline_scaling",
                "subject": f"{k}x data ({n_events:,} events)",
                "baseline": "1x wall",
                "ratio": wall / wall_1x,
                "seconds": wall,
                "events_per_s": n_events / wall,
                **{f"{name}_s": by_stage.get(name, 0.0) for name in STAGES},
            }
        )
    rows.append(
        {
            "benchmark": "pipeline_overhead",
            "subject": f"Prefect floor: a flow, {subflows} empty subflows, {artifacts} artifacts",
            "baseline": "1x wall",
            "ratio": floor_s / wall_1x,
            "seconds": floor_s,
            "note": "the 1x run's shape, read from the API; median of 3",
        }
    )
    rows.append(
        {
            "benchmark": "pipeline_overhead",
            "subject": "one-off starts: Prefect temporary API, Spark JVM",
            "baseline": "1x wall",
            "ratio": (prefect_start + jvm_start) / wall_1x,
            "seconds": prefect_start + jvm_start,
            "note": f"Prefect {prefect_start:.1f}s, JVM {jvm_start:.1f}s"
            + (" (JVM already up from an earlier benchmark)" if jvm_was_up else ""),
        }
    )
    return rows
