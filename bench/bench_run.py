"""The whole product as a user runs it: ``hybridflow run --no-cache`` in a fresh process (Prefect's
temporary API, the Spark JVM, every stage) against one plain Python process doing the same job
with DuckDB + torch (:mod:`bench.duckdb_torch_baseline`, trained for as many epochs as the
pipeline's train stage ran), on the same demo Parquet; plus the wall clock of a small real-shaped
transaction log (a CSV with only customer id, date, quantity, amount).

Sizes: ``BENCH_RUN_CUSTOMERS`` (default ``20000,200000``: the demo's 431,813 events and about
4.3M; empty: only the small log), over ``BENCH_RUN_DAYS`` days of events (default: the demo's
730; ``BENCH_RUN_CUSTOMERS=2000000 BENCH_RUN_DAYS=365`` is the 29.9M-event run of issue 34).
Wall and CPU seconds of each process tree; ratio = hybridflow / baseline, the run with a
temporary Prefect API of its own (a user's first command, and every figure before 7 Dec 2026);
``warm_ratio``, ``warm_seconds``, ``warm_startup_s``: the same run on the warm API a user's
second and later commands reuse (a Prefect home of the bench's own, started by a run of the
small log first, stopped by its PID at the end; a fresh store, so every contender is fitted
again; ``BENCH_RUN_WARM=0`` leaves it out); ``max_rss_mb``: the peak resident memory of the
``hybridflow`` process (``baseline_max_rss_mb``: the baseline's); for the small log, whether a
JVM started (``jvm_started``: a ``java`` process in the tree).
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from bench._proc import run_measured

SMALL_LOG_CUSTOMERS = 2_000
_LOG_MAPS = [
    arg
    for k, v in {
        "customer_id": "CustomerID",
        "event_time": "InvoiceDate",
        "quantity": "Quantity",
        "amount": "Amount",
    }.items()
    for arg in ("--map", f"{k}={v}")
]


def _hybridflow_run(
    events: Path,
    store: Path,
    *args: str,
    programs: set[str] | None = None,
    warm_home: Path | None = None,
) -> tuple[float, float, dict]:
    """``hybridflow run`` as a fresh process: a temporary Prefect API of its own (what
    ``python -m bench`` sets), or with ``warm_home`` the warm API of that Prefect home (what a
    user's second and later commands get; the home's first command starts it)."""
    cli = str(Path(sys.executable).with_name("hybridflow"))
    cmd = [cli, "run", "--events", str(events), "--no-cache", "--json", *args]
    env = os.environ | {"HYBRIDFLOW_STORE": str(store)}
    if warm_home is not None:
        env |= {"PREFECT_HOME": str(warm_home), "HYBRIDFLOW_WARM_API": "true"}
        env.pop("PREFECT_API_URL", None)
    memory: dict[str, float] = {}
    wall, cpu, out = run_measured(cmd, env=env, programs=programs, memory=memory)
    return wall, cpu, json.loads(out.strip().splitlines()[-1]) | memory


def _epochs(store: Path, run_id: str) -> int:
    """Epochs the run's network trained (the ``mlp`` contender, whichever family won)."""
    from infra.layout import version_manifest_key

    train = json.loads((store / "runs" / run_id / "train.json").read_text())
    mlp = next((r for r in train.get("leaderboard", []) if r["family"] == "mlp"), None)
    if mlp is None:
        return int(train["epochs"])
    manifest = json.loads((store / version_manifest_key(mlp["version"])).read_text())
    return int(manifest["training"]["epochs"])


def _small_transaction_log(work: Path) -> Path:
    """Purchases only, as a shop's export: customer id, date, quantity, amount (CSV)."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from tasks.data.demo_events import DemoDataParams, generate_demo_events

    demo = work / "small-demo"
    generate_demo_events(DemoDataParams(customers=SMALL_LOG_CUSTOMERS, seed=9), demo)
    table = pq.read_table(demo)
    table = table.filter(pc.equal(table["event_type"], "purchase"))
    path = work / "transactions.csv"
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
            writer.writerow([cid, t.strftime("%d/%m/%Y"), q, f"{a:.2f}" if a is not None else ""])
    return path


def _row(subject: str, wall: float, cpu: float, base: tuple[float, float] | None, **extra) -> dict:
    return {
        "benchmark": "hybridflow run",
        "subject": subject,
        "baseline": "DuckDB + torch, one process" if base else "-",
        "ratio": wall / base[0] if base else 0.0,
        "cpu_ratio": cpu / base[1] if base and base[1] else 0.0,
        "seconds": wall,
        "cpu_s": cpu,
        "baseline_s": base[0] if base else 0.0,
        "baseline_cpu_s": base[1] if base else 0.0,
        "load": os.getloadavg()[0],
        **extra,
    }


def main(results_dir: Path) -> list[dict]:
    """Each size: generate, run both as fresh processes, one row; then the small CSV log."""
    from tasks.data.demo_events import DemoDataParams, generate_demo_events

    sizes = os.environ.get("BENCH_RUN_CUSTOMERS", "20000,200000").split(",")
    sizes = [int(s) for s in sizes if s.strip()]  # empty: the small CSV log alone
    work = Path(tempfile.mkdtemp(prefix="hf-bench-run-"))
    warm_home = work / "warm-home"
    rows = []
    try:
        log = _small_transaction_log(work)
        with_warm = os.environ.get("BENCH_RUN_WARM", "1") != "0"
        if sizes and with_warm:  # a user's earlier command: it starts the warm API they reuse
            _hybridflow_run(log, work / "store-warm-up", *_LOG_MAPS, warm_home=warm_home)
        for customers in sizes:
            events = work / f"events-{customers}"
            days = int(os.environ.get("BENCH_RUN_DAYS") or DemoDataParams().days)
            params = DemoDataParams(customers=customers, days=days)
            n = generate_demo_events(params, events).events
            store = work / f"store-{customers}"
            wall, cpu, summary = _hybridflow_run(events, store)
            epochs = _epochs(store, summary["run_id"])
            warm_store = work / f"store-warm-{customers}"  # a store of its own: every fit again
            warm_wall, warm_cpu, warm = (
                _hybridflow_run(events, warm_store, warm_home=warm_home)
                if with_warm
                else (0.0, 0.0, {"stages": []})
            )
            base_cmd = [sys.executable, "-m", "bench.duckdb_torch_baseline", "--events"]
            base_memory: dict[str, float] = {}
            base_wall, base_cpu, out = run_measured(
                [
                    *base_cmd,
                    str(events),
                    "--out",
                    str(work / f"duck-{customers}"),
                    "--epochs",
                    str(epochs),
                ],
                memory=base_memory,
            )
            base = json.loads(out.strip().splitlines()[-1])
            stages = {s["name"]: round(s["seconds"], 1) for s in summary["stages"]}
            rows.append(
                _row(
                    f"{n:,} events ({customers:,} customers)",
                    wall,
                    cpu,
                    (base_wall, base_cpu),
                    stages_s=stages,
                    startup_s=round(summary.get("startup_seconds", 0.0), 1),
                    max_rss_mb=summary["max_rss_mb"],
                    baseline_max_rss_mb=base_memory["max_rss_mb"],
                    epochs=epochs,
                    auc=round(summary["metrics"]["test_auc"], 4),
                    champion=summary["metrics"].get("family", "mlp"),
                    baseline_auc=round(base["test_auc"], 4),
                    baseline_backtest_auc=round(base["backtest_auc"], 4),
                    warm_ratio=warm_wall / base_wall if base_wall else 0.0,
                    warm_cpu_ratio=warm_cpu / base_cpu if base_cpu else 0.0,
                    warm_seconds=warm_wall,
                    warm_cpu_s=warm_cpu,
                    warm_startup_s=round(warm.get("startup_seconds", 0.0), 1),
                    warm_stages_s={s["name"]: round(s["seconds"], 1) for s in warm["stages"]},
                )
            )
            for folder in (events, store, warm_store):
                shutil.rmtree(folder, ignore_errors=True)
        programs: set[str] = set()
        wall, cpu, summary = _hybridflow_run(log, work / "store-log", *_LOG_MAPS, programs=programs)
        rows.append(
            _row(
                f"small transaction log CSV ({summary['rows_read']:,} rows)",
                wall,
                cpu,
                None,
                stages_s={s["name"]: round(s["seconds"], 1) for s in summary["stages"]},
                jvm_started="java" in programs,
            )
        )
    finally:
        from infra.prefect_runtime.warm_api import stop_warm_api

        print(stop_warm_api(warm_home), flush=True)
        shutil.rmtree(work, ignore_errors=True)
    return rows
