"""Bring-your-own data end to end: a 4-column transaction log (own column names, semicolons,
day-first dates) trains and scores; the second run reuses the CPU stages' outputs; a forced
re-run replaces them atomically with the same content; a killed write leaves no visible partial
output; and the real CLI answers bad input with exit code 2 and one line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from infra.storage.datasets import find_dataset, publish_dataset
from infra.storage.registry import ModelRegistry
from infra.storage.store import LocalFolderStore
from tasks.data.input_formats import InputOptions
from tasks.definitions.feature_specs import feature_names
from tasks.reporting.records import FeaturesResult, ValidateResult, read_stage_manifest

REPO = Path(__file__).parents[2]
HYBRIDFLOW = Path(sys.executable).with_name("hybridflow")
SHOP_MAP = {
    "customer_id": "CustomerID",
    "event_time": "InvoiceDate",
    "amount": "Total",
    "quantity": "Qty",
}


def _transaction_log(demo_events: Path, out: Path) -> Path:
    """Purchases of the demo log as a shop's CSV export: 4 columns, ';', dd/MM/yyyy HH:mm:ss."""
    table = pq.read_table(
        demo_events, columns=["customer_id", "event_time", "event_type", "amount", "quantity"]
    )
    frame = table.to_pandas()
    frame = frame[frame["event_type"] == "purchase"].drop(columns="event_type")
    frame["event_time"] = frame["event_time"].dt.strftime("%d/%m/%Y %H:%M:%S")
    frame.columns = ["CustomerID", "InvoiceDate", "Total", "Qty"]
    out.mkdir(parents=True)
    half = len(frame) // 2
    frame.iloc[:half].to_csv(out / "2024.csv", sep=";", index=False)
    frame.iloc[half:].to_csv(out / "2025.csv", sep=";", index=False)
    return out


def _quarantine_artifact(quarantine_uri: str) -> list[dict]:
    """Rows of the run's ``quarantine`` table artifact, read back through the Prefect API."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    with get_client(sync_client=True) as client:
        artifacts = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["quarantine"]))
        )
    mine = [a for a in artifacts if quarantine_uri in (a.description or "")]
    assert len(mine) == 1
    data = mine[0].data
    return json.loads(data) if isinstance(data, str) else data


@pytest.mark.slow(reason="a pipeline run on a CSV log, its cached re-run and a forced re-run")
@pytest.mark.integration
def test_transaction_log_trains_scores_caches_and_reruns_atomically(
    prefect_harness, demo_events, tmp_path
):
    from flows.params import StageParams
    from flows.pipeline import PipelineParams, pipeline_flow
    from flows.prepare import prepare_flow

    log = _transaction_log(demo_events, tmp_path / "shop")
    store_uri = str(tmp_path / "store")
    store = LocalFolderStore(store_uri)
    options = InputOptions(column_map=SHOP_MAP)

    summary = pipeline_flow(
        PipelineParams(events=str(log), input=options, device="cpu", store=store_uri)
    )
    assert summary.status == "completed" and summary.rows_scored > 1000
    assert summary.quarantine_reasons.keys() <= {
        "missing_customer_id",
        "invalid_amount",
        "duplicate_event",
    }
    assert summary.rows_quarantined == sum(summary.quarantine_reasons.values()) > 0
    assert not any(s.cached for s in summary.stages)
    four_columns = {"customer_id", "event_time", "amount", "quantity"}
    manifest = ModelRegistry(store).get(summary.model_version)
    assert manifest.features == feature_names(four_columns)
    assert "basket_size_mean" in manifest.features and "n_events" not in manifest.features
    assert pq.read_table(summary.predictions_uri).num_rows == summary.rows_scored

    table = _quarantine_artifact(summary.quarantine_uri)
    assert {r["reason"]: r["rows"] for r in table} == summary.quarantine_reasons

    first = read_stage_manifest(store, summary.run_id, "features", FeaturesResult)
    scoring = find_dataset(store, first.scoring_prefix)

    cached = prepare_flow(StageParams(events=str(log), input=options, store=store_uri))
    validated = read_stage_manifest(store, cached.run_id, "validate", ValidateResult)
    features = read_stage_manifest(store, cached.run_id, "features", FeaturesResult)
    assert cached.run_id != summary.run_id
    assert validated.report.cached and features.report.cached
    assert validated.quarantine_uri == summary.quarantine_uri
    assert features.training_prefix == first.training_prefix
    assert find_dataset(store, first.scoring_prefix).data_prefix == scoring.data_prefix

    forced = prepare_flow(
        StageParams(events=str(log), input=options, use_cache=False, store=store_uri)
    )
    again = read_stage_manifest(store, forced.run_id, "features", FeaturesResult)
    assert not again.report.cached and again.scoring_prefix != first.scoring_prefix
    # a forced re-run publishes under its own run key: the first run's features stay untouched
    assert find_dataset(store, first.scoring_prefix).data_prefix == scoring.data_prefix
    recomputed = find_dataset(store, again.scoring_prefix)
    assert recomputed.data_prefix != scoring.data_prefix and recomputed.rows == scoring.rows
    old = pq.read_table(store.local_path(scoring.data_prefix)).sort_by("customer_id")
    new = pq.read_table(store.local_path(recomputed.data_prefix)).sort_by("customer_id")
    assert old.schema.equals(new.schema) and old.num_rows == new.num_rows
    for column in old.column_names:
        if pa.types.is_floating(old.schema.field(column).type):
            # DuckDB's parallel sums may add in another order: equal to the last bits
            np.testing.assert_allclose(new[column].to_numpy(), old[column].to_numpy(), rtol=1e-12)
        else:
            assert new[column].equals(old[column]), column


def _orphan_after_crash(store: LocalFolderStore, prefix: str) -> None:
    """What a crash between publishing a data folder and its manifest leaves behind."""
    orphan = store.root / prefix / "data-crashedrun1"
    orphan.mkdir(parents=True)
    pq.write_table(pa.table({"id": [-1]}), orphan / "part-0.parquet")


def test_unpublished_data_folders_stay_invisible_and_are_swept(tmp_path):
    store = LocalFolderStore(tmp_path / "store")
    stale, fresh = store.staging_dir(), store.staging_dir()
    (stale / "part-0.parquet").write_bytes(b"half written")
    os.utime(stale, (time.time() - 7 * 3600, time.time() - 7 * 3600))
    prefix = "features/as_of=2025-01-01"
    staged = tmp_path / "v1"
    staged.mkdir()
    pq.write_table(pa.table({"id": [1, 2]}), staged / "part-0.parquet")
    v1 = publish_dataset(store, staged, prefix, rows=2)
    _orphan_after_crash(store, prefix)
    assert find_dataset(store, prefix).data_prefix == v1.data_prefix
    staged = tmp_path / "v2"
    staged.mkdir()
    pq.write_table(pa.table({"id": [3]}), staged / "part-0.parquet")
    v2 = publish_dataset(store, staged, prefix, rows=1)
    folders = sorted(p.name for p in (store.root / prefix).iterdir() if p.name.startswith("data-"))
    assert folders == sorted([v1.data_prefix.split("/")[-1], v2.data_prefix.split("/")[-1]])
    assert not stale.exists() and fresh.is_dir()  # a killed run's staging goes after 6 hours


KILLED_WRITER = textwrap.dedent(
    """
    import sys
    from infra.settings import HybridflowSettings
    from infra.compute.spark import get_spark
    from infra.storage.store import LocalFolderStore
    from infra.compute.spark_io import write_dataset

    spark = get_spark(HybridflowSettings())
    store = LocalFolderStore(sys.argv[1])
    prefix = "features/as_of=2025-01-01"
    write_dataset(spark.range(1000).selectExpr("id", "'old' AS gen"), store, prefix)
    print("PUBLISHED", flush=True)
    big = spark.range(0, 30_000_000, numPartitions=8).selectExpr(
        "id", "'new' AS gen", "sha2(CAST(id AS STRING), 256) AS pad"
    )
    write_dataset(big, store, prefix)
    print("DONE", flush=True)
    """
)


@pytest.mark.e2e
def test_killed_write_leaves_no_visible_partial_output(tmp_path):
    store_root = tmp_path / "store"
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED_WRITER, str(store_root)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.strip() == "PUBLISHED":
                break
        assert proc.poll() is None, "the writer died before publishing the first generation"
        deadline = time.monotonic() + 180
        staging = store_root / ".staging"
        while time.monotonic() < deadline:
            if any(p.is_file() and p.name.startswith("part-") for p in staging.rglob("*")):
                break
            assert proc.poll() is None, "the writer finished before it could be killed"
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    store = LocalFolderStore(store_root)
    manifest = find_dataset(store, "features/as_of=2025-01-01")
    table = pq.read_table(store.local_path(manifest.data_prefix))
    assert manifest.rows == table.num_rows == 1000
    assert set(table.column("gen").to_pylist()) == {"old"}


def _error_line(stderr: str) -> str:
    """The CLI's one error line (Prefect may still log its server shutdown after it)."""
    lines = [line for line in stderr.splitlines() if line.startswith("hybridflow: ")]
    assert len(lines) == 1, stderr[-3000:]
    assert "Traceback" not in stderr
    return lines[0]


def _cli(tmp_path: Path, *args: str, api_url: str | None = None) -> subprocess.CompletedProcess:
    """``hybridflow run ARGS``: with its own temporary API, or reporting to ``api_url``."""
    env = os.environ | {
        "HYBRIDFLOW_STORE": str(tmp_path / "store"),
        "PREFECT_HOME": str(tmp_path / "prefect"),
        "HYBRIDFLOW_SPARK_DRIVER_MEMORY": "2g",
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
    }
    env.pop("PREFECT_API_URL", None)
    if api_url:
        env["PREFECT_API_URL"] = api_url
    return subprocess.run(
        [str(HYBRIDFLOW), "run", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.e2e
def test_cli_bad_input_exits_2_with_one_line(tmp_path):
    events = tmp_path / "shop.csv"
    events.write_text("Client;When;Qty\nc1;2025-01-01 10:00;1\n")
    done = _cli(tmp_path, "--events", str(events), "--map", "customer_id=client")
    assert done.returncode == 2, done.stderr[-2000:]
    last = _error_line(done.stderr)
    assert last.startswith(
        "hybridflow: error: events are missing required column(s) event_time, amount"
    )
    # refused from the header alone: Prefect's API never started (it creates its database)
    assert not (tmp_path / "prefect" / "prefect.db").exists()


@pytest.mark.e2e
def test_cli_too_many_bad_rows_exits_2_after_writing_the_quarantine(tmp_path, session_api_url):
    events = tmp_path / "events.csv"
    events.write_text(
        "customer_id,event_time,amount\n"
        "c1,2025-01-01 10:00:00,1\nc2,2025-01-02 10:00:00,2\n"
        ",2025-01-03 10:00:00,3\nc4,2025-01-04 10:00:00,-4\n"
    )
    args = ["--events", str(events), "--max-bad-fraction", "0.1", "--json"]
    done = _cli(tmp_path, *args, api_url=session_api_url)
    assert done.returncode == 2, done.stderr[-2000:]
    last = _error_line(done.stderr)
    assert "2 of 4 event rows (50.0%) are bad, over --max-bad-fraction 10.0%" in last
    quarantine = Path(last.rsplit("see ", 1)[1])
    rows = pq.read_table(quarantine).to_pylist()
    assert sorted(r["reason"] for r in rows) == ["invalid_amount", "missing_customer_id"]
    assert {r["amount"] for r in rows} == {"3", "-4"}
    assert not done.stdout.strip().startswith("{")
