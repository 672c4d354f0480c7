"""``hybridflow demo-data`` memory stays bounded by one chunk of customers, not the total."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow.parquet as pq

_CHILD = textwrap.dedent(
    """
    import json, resource, sys
    from pathlib import Path
    from tasks.data.demo_events import DemoDataParams, generate_demo_events

    customers, per_file, out = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    summary = generate_demo_events(
        DemoDataParams(customers=customers, customers_per_file=per_file, seed=5), out
    )
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"growth_mib": (peak - before) / 1024, "events": summary.events,
                      "files": summary.files}))
    """
)


def _generate(customers: int, per_file: int, out: Path) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(customers), str(per_file), str(out)],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_peak_memory_does_not_grow_with_the_number_of_customers(tmp_path):
    one_chunk = _generate(20_000, 20_000, tmp_path / "one")
    eight_chunks = _generate(160_000, 20_000, tmp_path / "eight")
    assert eight_chunks["files"] == 8
    assert eight_chunks["events"] > 7 * one_chunk["events"]
    # 8x the events, about the same high-water mark: only one chunk is ever in memory
    assert eight_chunks["growth_mib"] < 1.5 * one_chunk["growth_mib"] + 40, (
        one_chunk,
        eight_chunks,
    )
    rows = sum(pq.ParquetFile(f).metadata.num_rows for f in (tmp_path / "eight").glob("*.parquet"))
    assert rows == eight_chunks["events"]
