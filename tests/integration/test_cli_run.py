"""``hybridflow`` as a user runs it: a real subprocess, its stdout, stderr and exit code."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.noise_log import map_args, write_noise_log

pytestmark = pytest.mark.integration
NOISE_CUSTOMERS, NOISE_ROWS = 1000, 12_000


def _hybridflow(args, cwd, store, timeout=600, api_url=None):
    """The command in a subprocess: with its own temporary Prefect API, or reporting to
    ``api_url`` (the session's, for tests not about the command's own API)."""
    env = dict(os.environ, HYBRIDFLOW_STORE=str(store))
    env.pop("PREFECT_API_URL", None)  # embedded mode: the CLI starts its own ephemeral API
    if api_url:
        env["PREFECT_API_URL"] = api_url
    env["PREFECT_HOME"] = str(cwd / "prefect-home")
    return subprocess.run(
        [sys.executable, "-m", "cli.main", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _temporary_apis(prefect_home) -> list[int]:
    """PIDs of Prefect API servers (uvicorn) whose PREFECT_HOME is ``prefect_home``."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes()
            environ = (proc / "environ").read_bytes().split(b"\0")
        except (OSError, ValueError):
            continue
        if b"prefect.server.api.server:create_app" in cmdline and (
            f"PREFECT_HOME={prefect_home}".encode() in environ
        ):
            found.append(int(proc.name))
    return found


def test_bad_input_exits_2_with_one_line(tmp_path):
    csv = tmp_path / "events.csv"
    csv.write_text("customer_id,amount\nA,1.0\n")
    proc = _hybridflow(["run", "--events", str(csv)], tmp_path, tmp_path / "store")
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("hybridflow:")]
    assert len(errors) == 1 and errors[0].startswith("hybridflow: error:")
    assert "missing required column(s) event_time" in errors[0]
    assert "Traceback" not in proc.stderr
    # refused from the header alone: Prefect's API never started (it creates its database)
    assert not (tmp_path / "prefect-home" / "prefect.db").exists()


def test_missing_path_exits_2(tmp_path):
    proc = _hybridflow(["run", "--events", str(tmp_path / "nope")], tmp_path, tmp_path / "store")
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if line.startswith("hybridflow:")]
    assert errors == [f"hybridflow: error: events path not found: {tmp_path / 'nope'}"]
    assert "Traceback" not in proc.stderr


def _four_column_log(demo_events: Path, path: Path) -> Path:
    """The demo's purchases as a shop exports them: customer, date, quantity, amount (CSV)."""
    import csv

    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    table = pq.read_table(demo_events)
    table = table.filter(pc.equal(table["event_type"], "purchase"))
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["CustomerID", "InvoiceDate", "Quantity", "Amount"])
        for cid, t, q, a in zip(
            table["customer_id"].to_pylist(),
            table["event_time"].to_pylist(),
            table["quantity"].to_pylist(),
            table["amount"].to_pylist(),
            strict=True,
        ):
            writer.writerow([cid, t.strftime("%d/%m/%Y"), q, "" if a is None else f"{a:.2f}"])
    return path


@pytest.mark.slow(
    reason="a whole `hybridflow run` subprocess: interpreter, imports, its temporary Prefect API, four contenders"
)
def test_first_run_on_a_four_column_log_prints_the_summary_last_with_a_leaderboard(
    demo_events, tmp_path
):
    """One `hybridflow run --json` as a user runs it, on a shop's four-column CSV export mapped
    with ``--map``: the summary line last, the temporary API stopped at exit, predictions and a
    leaderboard of every family, then ``models list``. (The demo's Parquet log runs through the
    CLI to its summary in tests/e2e: test_cluster_run.py, test_refresh_triggers.py.)"""
    log = _four_column_log(demo_events, tmp_path / "transactions.csv")
    maps = [
        "customer_id=CustomerID",
        "event_time=InvoiceDate",
        "quantity=Quantity",
        "amount=Amount",
    ]
    args = ["run", "--events", str(log), "--json"] + [a for m in maps for a in ("--map", m)]
    proc = _hybridflow(args, tmp_path, tmp_path / "store")
    assert proc.returncode == 0, proc.stderr[-3000:]
    # the CLI exits without interpreter teardown, after its exit handlers: the temporary API
    # it started is stopped, Prefect's workers drained without errors
    assert _temporary_apis(tmp_path / "prefect-home") == []
    assert "Error logging to API" not in proc.stderr
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    for key in (
        "status",
        "flow_run_id",
        "model_version",
        "promoted",
        "metrics",
        "predictions_uri",
        "rows_read",
        "rows_quarantined",
        "rows_scored",
        "stages",
    ):
        assert key in summary, key
    assert summary["status"] == "completed" and summary["promoted"] is True
    assert summary["scored_with"] == summary["model_version"]
    assert set(summary["metrics"]) >= {
        "test_auc",
        "test_pr_auc",
        "test_logloss",
        "n_train",
        "n_test",
    }
    names = [s["name"] for s in summary["stages"]]
    # one contender unit per family between preprocess and train (default: rfm, logistic, gbm,
    # mlp)
    assert names[:3] == ["validate", "features", "preprocess"]
    assert names[-2:] == ["train", "batch_inference"]
    assert sorted(names[3:-2]) == [
        "contender-gbm",
        "contender-logistic",
        "contender-mlp",
        "contender-rfm",
    ]
    assert all({"name", "seconds", "device"} <= set(s) for s in summary["stages"])
    # the run's fixed cost, from the process's start to its first stage, step by step
    steps = summary["startup"]
    assert list(steps) == [
        "interpreter",
        "imports",
        "prefect_api",
        "pipeline_flow_run",
        "planning",
    ]
    assert all(v >= 0 for v in steps.values())
    assert summary["startup_seconds"] == pytest.approx(sum(steps.values()), abs=0.01)
    assert 0 < summary["startup_seconds"] < summary["seconds"] + steps["interpreter"] + 60

    assert summary["rows_scored"] > 1000
    board = summary["metrics"]["leaderboard"]
    assert sorted(r["family"] for r in board) == ["gbm", "logistic", "mlp", "rfm"]
    assert board[0]["champion"] and board[0]["family"] == summary["metrics"]["family"]
    assert board[0]["version"] == summary["model_version"]
    assert [r["logloss"] for r in board] == sorted(r["logloss"] for r in board)
    import pandas as pd

    predictions = pd.read_parquet(summary["predictions_uri"])
    assert len(predictions) == summary["rows_scored"] and predictions.score.between(0, 1).all()

    listing = _hybridflow(["models", "list"], tmp_path, tmp_path / "store", timeout=120)
    assert listing.returncode == 0 and f"* {summary['model_version']}" in listing.stdout


@pytest.mark.slow(
    reason="a whole `hybridflow run` subprocess (on the session's API): interpreter, imports, "
    "four contenders"
)
def test_first_run_on_a_near_noise_log_serves_a_model(tmp_path, session_api_url):
    """A four-column log with the shop's own column names and dd/mm/yyyy dates, whose purchases
    fall on uniform random days (:mod:`tests.fixtures.noise_log`): nothing beats the RFM
    baseline out of time but chance. The first run still exits 0 with predictions (it used to
    exit 2, "no model to score with"), and the summary names the family it serves."""
    log = write_noise_log(tmp_path / "noise.csv", customers=NOISE_CUSTOMERS, rows=NOISE_ROWS)
    args = ["run", "--events", str(log), "--timestamp-format", "dd/MM/yyyy", "--json"]
    proc = _hybridflow([*args, *map_args()], tmp_path, tmp_path / "store", api_url=session_api_url)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["status"] == "completed" and summary["promoted"] is True
    assert summary["scored_with"] == summary["model_version"]
    family = summary["metrics"]["family"]
    board = {r["family"]: r for r in summary["metrics"]["leaderboard"]}
    assert set(board) == {"rfm", "logistic", "gbm", "mlp"}
    assert board[family]["version"] == summary["model_version"]
    assert summary["metrics"]["champion"].startswith(
        next(r["family"] for r in summary["metrics"]["leaderboard"] if r["champion"])
    )
    if family == "rfm":  # the baseline's recipe: promoted as such, in words, never "beats"
        assert "the RFM baseline's own recipe (family rfm)" in summary["promotion_reason"]
    import pandas as pd

    predictions = pd.read_parquet(summary["predictions_uri"])
    assert len(predictions) == summary["rows_scored"] == NOISE_CUSTOMERS
    assert predictions.score.between(0, 1).all()
    assert (predictions.model_version == summary["model_version"]).all()
