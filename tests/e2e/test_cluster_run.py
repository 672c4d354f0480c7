"""`hybridflow run` against a real two-worker Spark cluster from the pyspark wheel as a
client-mode driver (``HYBRIDFLOW_SPARK_MASTER=spark://...``), validate and features on its
executors (a threshold under the ~9.5k events, over the ~600 examples), gives the predictions of
local mode, where this input is validated, featured, preprocessed and scored in the flow's
process: the engines agree end to end, and the work ran on executors both workers launched.
(The Spark Connect path runs the whole pipeline in ``test_deployed_stack.py``; a third pipeline
run here would cost about three minutes.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import httpx
import pyarrow.parquet as pq
import pytest

from infra.settings import HybridflowSettings
from tests.e2e.stack_driver import REPO, assert_cluster_maps_class_archive

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]

# full-batch training without dropout does not depend on the order Spark hands the snapshot's
# rows over in (files and rows are ordered by the engine's partitioning), so every engine must
# give the same model, up to float summation order
SAME_MODEL = {
    "HYBRIDFLOW_TRAIN__FAMILIES": "mlp",
    "HYBRIDFLOW_TRAIN__SPECS": '{"mlp": {"dropout": 0}}',
    "HYBRIDFLOW_TRAIN__BATCH_SIZE": "65536",
    "HYBRIDFLOW_TRAIN__MAX_EPOCHS": "15",
}


def _run(events, tmp_path, name: str, api_url: str, extra: dict[str, str]) -> dict:
    """``hybridflow run --json`` on ``events`` with a store of its own, reporting to the
    session's Prefect API (both runs share it: neither starts a temporary one)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_API", "AWS_"))}
    env.update(
        HYBRIDFLOW_STORE=str(tmp_path / name / "store"),
        HYBRIDFLOW_WORK_DIR=str(tmp_path / name / "work"),
        PREFECT_HOME=str(tmp_path / name / "prefect"),
        PREFECT_API_URL=api_url,
        **SAME_MODEL,
        **extra,
    )
    proc = subprocess.run(
        [sys.executable, "-m", "cli.main", "run", "--events", str(events), "--json"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, f"{name}: {proc.stderr[-3000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _scores(summary: dict) -> dict[str, float]:
    table = pq.read_table(summary["predictions_uri"])
    return dict(zip(table["customer_id"].to_pylist(), table["score"].to_pylist(), strict=True))


def _same_predictions(local: dict, other: dict, name: str) -> None:
    expected, got = _scores(local), _scores(other)
    assert set(got) == set(expected), f"{name}: other customers scored"
    worst = max(abs(got[c] - expected[c]) for c in expected)
    assert worst < 1e-4, f"{name}: scores differ from local mode by up to {worst:.2e}"
    assert other["rows_read"] == local["rows_read"]
    assert other["rows_quarantined"] == local["rows_quarantined"]


def _jobs(summary: dict) -> dict[str, int | None]:
    """Spark jobs of the stages that pick their engine by size."""
    wanted = ("validate", "features", "preprocess")
    return {s["name"]: s["spark_jobs"] for s in summary["stages"] if s["name"] in wanted}


def _executors_of(master_ui: str, app_name: str) -> list[dict]:
    """Executors the workers launched for ``app_name`` (each worker's own JSON status)."""
    status = httpx.get(f"{master_ui}/json/", timeout=10).json()
    apps = {
        a["id"] for a in status["activeapps"] + status["completedapps"] if a["name"] == app_name
    }
    found = []
    for worker in status["workers"]:
        info = httpx.get(f"{worker['webuiaddress']}/json/", timeout=10).json()
        found += [
            e | {"worker": worker["id"]}
            for e in info["executors"] + info["finishedexecutors"]
            if e["appid"] in apps
        ]
    return found


@pytest.fixture
def events(tmp_path):
    """Small events: two runs of the whole pipeline follow."""
    from tasks.data.demo_events import DemoDataParams, generate_demo_events

    out = tmp_path / "events"
    generate_demo_events(DemoDataParams(customers=800, days=400, seed=3), out)
    return out


@pytest.mark.slow(
    reason="a two-worker Spark cluster and two `hybridflow run` pipelines (local mode and a client-mode driver)"
)
def test_run_on_a_two_worker_cluster_gives_local_predictions(tmp_path, events, session_api_url):
    from infra.stack.processes import launcher_into, stop
    from infra.stack.spark_cluster import (
        SparkClusterSpec,
        start_standalone,
        stop_cluster,
    )

    local = _run(events, tmp_path, "local", session_api_url, {})
    archives = HybridflowSettings(_env_file=None).class_archive_dir()
    spec = SparkClusterSpec(
        workers=2,
        worker_cores=1,
        worker_memory="1g",
        driver_memory="1g",
        class_archive_dir=archives,
    )
    records: dict = {}
    launch = launcher_into(records, tmp_path / "cluster" / "logs", REPO)
    try:
        master_url, master_ui = start_standalone(
            launch, tmp_path / "cluster", spec, dict(os.environ)
        )
        # a client-mode driver's settings size the executors the workers launch for it
        executor_conf = {"spark.executor.extraJavaOptions": spec.jvm().java_options}
        client = _run(
            events,
            tmp_path,
            "client-mode",
            session_api_url,
            {
                "HYBRIDFLOW_SPARK_MASTER": master_url,
                "HYBRIDFLOW_SPARK_EXECUTOR_MEMORY": "1g",
                "HYBRIDFLOW_IN_PROCESS_ROWS": "5000",
                "HYBRIDFLOW_SPARK_CONF": json.dumps(executor_conf),
            },
        )
        _same_predictions(local, client, "spark:// client mode")
        assert _jobs(local) == {"validate": 0, "features": 0, "preprocess": 0}
        assert _jobs(client)["validate"] and _jobs(client)["features"], _jobs(client)
        executors = _executors_of(master_ui, "hybridflow")
        assert len({e["worker"] for e in executors}) == 2, executors
        assert_cluster_maps_class_archive([r.pid for r in records.values()], tmp_path / "cluster")
    finally:
        stop_cluster(records)
    assert all(stop(r) == "not running" for r in records.values())
