"""``make bench`` / ``python -m bench [NAME ...]``: run every ``bench/bench_*.py`` (or the named
ones). Each module exposes ``main(results_dir: Path) -> list[dict]`` returning rows with at least
``benchmark``, ``subject``, ``baseline`` and ``ratio``; rows are printed as one table and saved
as JSON under ``bench/results/``."""

from __future__ import annotations

import importlib
import json
import os
import pkgutil
import sys
import time
from pathlib import Path

from infra.prefect_runtime.env import configure_prefect_defaults

RESULTS = Path(__file__).parent / "results"


def discover(names: list[str]) -> list[str]:
    """Benchmark module names, all of them or those matching ``names``."""
    found = sorted(
        m.name
        for m in pkgutil.iter_modules([str(Path(__file__).parent)])
        if m.name.startswith("bench_")
    )
    if names:
        found = [m for m in found if any(n in m for n in names)]
    return found


def print_table(rows: list[dict]) -> None:
    """Rows as an aligned text table (columns from the union of keys)."""
    if not rows:
        return
    cols: list[str] = []
    for r in rows:
        cols += [k for k in r if k not in cols]
    cells = [[_fmt(r.get(c, "")) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True)))
    for row in cells:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)))


def _fmt(v: object) -> str:
    if isinstance(v, float):
        return f"{v:,.3f}" if abs(v) < 1000 else f"{v:,.0f}"
    return str(v)


def main(argv: list[str]) -> int:
    """Run the benchmarks and print one table."""
    configure_prefect_defaults()
    # each `hybridflow` a benchmark starts has a temporary Prefect API, as in the figures so far
    # and so that none is left behind; bench_startup measures the warm API against it
    os.environ.setdefault("HYBRIDFLOW_WARM_API", "false")
    RESULTS.mkdir(parents=True, exist_ok=True)
    all_rows: list[dict] = []
    for name in discover(argv):
        started = time.perf_counter()
        print(f"== {name}", flush=True)
        rows = importlib.import_module(f"bench.{name}").main(RESULTS)
        print_table(rows)
        print(f"   ({time.perf_counter() - started:.0f}s)\n", flush=True)
        all_rows += rows
        (RESULTS / f"{name}.json").write_text(json.dumps(rows, indent=2, default=str))
    print("== all benchmarks")
    print_table(all_rows)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
