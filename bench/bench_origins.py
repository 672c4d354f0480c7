"""Training on several past origins against one: out-of-time quality and what it costs.

For each event log (the demo data, the demo data with a planted shift, and a four-column log made
from the demo data: a retail log of purchases with only a customer, a time, a quantity and an
amount, under other column names read through the column map) the features, preprocess and
train stages run once per origin setting, each in a fresh store (no warm start, no reuse): one
origin (today's run, the baseline) and several, with the stride equal to the horizon and
shorter. Reported per setting: the out-of-time backtest (the network trained on origins from
T-2H down, calibrated, judged on every customer at T-H: ROC AUC, log loss, ECE, mean score
against the rate), the RFM baseline's backtest log loss, the examples trained on, the
snapshot's size and the seconds of the features, preprocess and train stages (the train
stage's also in CPU seconds of this process, steadier on a shared machine), one row per model
family (the settings' contenders, ``BENCH_ORIGINS_FAMILIES`` to choose) from the run's
leaderboard; ``ratio`` is the family's one-origin fit seconds over this setting's (below 1:
slower). A one-origin run on 1,000 demo customers warms up first (torch's imports),
unreported.

``BENCH_ORIGINS_CUSTOMERS`` sets the size (default 20,000 customers over two years, the demo's,
about 430k events), ``BENCH_ORIGINS_SETTINGS`` the settings (``count:stride`` separated by
commas, stride ``h`` for the horizon; default ``1:h,2:h,4:h,4:30,8:30``) and
``BENCH_ORIGINS_LOGS`` the logs (default ``demo,shift,four-column``). Every stage runs in this
process (DuckDB, pyarrow, torch on the CPU).
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
import tempfile
import time
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq

HORIZON_DAYS = 90
SHIFT_AFTER = dt.date(2025, 9, 1)  # a month before T-H of the demo's last day
FOUR_COLUMNS = {
    "customer_id": "Client",
    "event_time": "InvoiceDate",
    "quantity": "Qty",
    "amount": "Total",
}


def parse_settings(text: str) -> list[tuple[int, int | None]]:
    """``"1:h,4:30"`` as ``[(1, None), (4, 30)]`` (``h``: the horizon)."""
    out = []
    for item in text.split(","):
        count, _, stride = item.strip().partition(":")
        out.append((int(count), None if stride in ("", "h") else int(stride)))
    return out


def four_column_log(events: Path, out: Path) -> Path:
    """The demo's purchases as a retail log: customer, time, quantity and amount only, under
    the column names of :data:`FOUR_COLUMNS` (read back through the column map)."""
    table = pq.read_table(events, columns=["event_type", *FOUR_COLUMNS])
    purchases = table.filter(pc.equal(table["event_type"], "purchase")).drop(["event_type"])
    renamed = purchases.rename_columns([FOUR_COLUMNS[c] for c in purchases.column_names])
    out.mkdir(parents=True)
    pq.write_table(renamed, out / "part-0.parquet")
    return out


def _events(kind: str, customers: int, work: Path) -> tuple[Path, dict[str, str]]:
    from tasks.data.demo_events import DemoDataParams, generate_demo_events

    shift = {"shift_after": SHIFT_AFTER} if kind == "shift" else {}
    raw = work / f"raw-{kind}"
    generate_demo_events(DemoDataParams(customers=customers, days=730, seed=42, **shift), raw)
    if kind != "four-column":
        return raw, {}
    return four_column_log(raw, work / "four-column"), dict(FOUR_COLUMNS)


def _size(store, prefix: str) -> int:
    from infra.storage.datasets import read_dataset_manifest

    manifest = read_dataset_manifest(store, prefix)
    return sum(store.local_path(key).stat().st_size for key in manifest.files)


def _one_setting(
    events: Path, column_map: dict[str, str], store_dir: Path, origins, families: list[str]
) -> list[dict]:
    from infra.compute.spark import SparkOnDemand
    from infra.settings import get_settings
    from infra.storage.store import LocalFolderStore
    from tasks.data.input_formats import InputOptions
    from tasks.stages.features import features_stage
    from tasks.stages.preprocess import preprocess_stage
    from tasks.stages.train import TrainingOptions, train_stage
    from tasks.stages.validate import validate_stage

    settings = get_settings()
    settings = settings.model_copy(
        update={"train": settings.train.model_copy(update={"families": families})}
    )
    spark = SparkOnDemand(settings)
    store = LocalFolderStore(store_dir)
    options = InputOptions(column_map=column_map)
    v = validate_stage(spark, store, "bench", str(events), 0.05, options, use_cache=False)
    f = features_stage(
        spark, store, "bench", v, None, HORIZON_DAYS, use_cache=False, origins=origins
    )
    p = preprocess_stage(spark, store, f, settings.train.seed, use_cache=False, run_id="bench")
    started, cpu = time.perf_counter(), time.process_time()
    out = train_stage(
        store,
        p,
        settings,
        as_of=f.as_of,
        horizon_days=f.horizon_days,
        device_preference="cpu",
        options=TrainingOptions(scratch=True),
    )
    train_s, train_cpu_s = time.perf_counter() - started, time.process_time() - cpu
    assert out is not None and out.result.leaderboard
    common = {
        "origins": len(f.training_origins),
        "examples": f.n_training,
        "backtest_examples": f.n_backtest,
        "snapshot_mb": _size(store, p.snapshot_prefix) / 2**20,
        "features_s": f.report.seconds,
        "preprocess_s": p.report.seconds,
        "train_stage_s": train_s,
        "train_stage_cpu_s": train_cpu_s,
    }
    rows = []
    for row in out.result.leaderboard:
        if row.basis != "backtest":
            raise AssertionError(f"the backtest was skipped: {out.result.champion_reason}")
        rows.append(
            {
                "family": row.family,
                **common,
                "bt_auc": row.auc,
                "bt_logloss": row.logloss,
                "bt_ece": row.ece,
                "bt_mean_score": row.mean_score,
                "bt_rate": row.positive_rate,
                "test_auc": row.test_auc,
                "fit_s": row.train_seconds,
                "family_s": row.seconds,
            }
        )
    return rows


def main(results_dir: Path) -> list[dict]:
    """Each log, each origin setting, each family: the backtest and the cost, against one
    origin."""
    from infra.settings import get_settings
    from tasks.data.cutoffs import Origins

    customers = int(os.environ.get("BENCH_ORIGINS_CUSTOMERS", "20000"))
    settings = parse_settings(os.environ.get("BENCH_ORIGINS_SETTINGS", "1:h,2:h,4:h,4:30,8:30"))
    logs = os.environ.get("BENCH_ORIGINS_LOGS", "demo,shift,four-column").split(",")
    default = ",".join(get_settings().train.families)
    families = os.environ.get("BENCH_ORIGINS_FAMILIES", default).split(",")
    work = Path(tempfile.mkdtemp(prefix="hf-bench-origins-"))
    rows: list[dict] = []
    try:
        for i, kind in enumerate(logs):
            events, column_map = _events(kind, customers, work)
            if i == 0:  # warm-up: the first train stage pays torch's imports and first calls
                small, _ = _events("demo", 1000, work / "warm-up")
                _one_setting(small, {}, work / "warm-up" / "store", Origins(1), families)
                shutil.rmtree(work / "warm-up", ignore_errors=True)
            first: dict[str, dict] = {}
            for count, stride in settings:
                store_dir = work / f"store-{kind}-{count}-{stride}"
                got = _one_setting(events, column_map, store_dir, Origins(count, stride), families)
                shutil.rmtree(store_dir, ignore_errors=True)
                for row in got:
                    one = first.setdefault(row["family"], row)
                    rows.append(
                        {
                            "benchmark": f"origins ({kind}, {row['family']})",
                            "subject": f"{count} origin(s), stride {stride or HORIZON_DAYS} days",
                            "baseline": "1 origin (T-H only)",
                            "ratio": one["fit_s"] / row["fit_s"],
                            "customers": customers,
                            **row,
                            "bt_logloss_vs_1": row["bt_logloss"] - one["bt_logloss"],
                            "load": os.getloadavg()[0],
                        }
                    )
                    print({k: v for k, v in rows[-1].items() if k != "baseline"}, flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return rows
