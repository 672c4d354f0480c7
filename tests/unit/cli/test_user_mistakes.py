"""A user's mistakes on the command line: exit code 2, one line naming what is wrong, no
traceback, and nothing started (no Prefect API, no JVM) or published for it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HYBRIDFLOW = Path(sys.executable).with_name("hybridflow")
GOOD_CSV = "customer_id,event_time,amount\nc1,2025-01-01 10:00:00,1\nc2,2025-01-02 10:00:00,2\n"


def _hybridflow(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = os.environ | {
        "HYBRIDFLOW_STORE": str(tmp_path / "store"),
        "PREFECT_HOME": str(tmp_path / "prefect"),
    }
    env.pop("PREFECT_API_URL", None)
    return subprocess.run(
        [str(HYBRIDFLOW), *args], cwd=tmp_path, env=env, capture_output=True, text=True
    )


def _refused(tmp_path: Path, *args: str) -> str:
    """The one line a refused command prints (exit 2, no traceback, no API started)."""
    done = _hybridflow(tmp_path, *args)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr[-3000:]
    assert not (tmp_path / "prefect" / "prefect.db").exists()
    assert not (tmp_path / "store" / "runs").exists()
    return lines[0]


@pytest.mark.parametrize("days", ["0", "-5", "100000", "ninety"])
def test_a_horizon_out_of_bounds_is_refused_naming_the_bounds(tmp_path, days):
    events = tmp_path / "events.csv"
    events.write_text(GOOD_CSV)
    line = _refused(tmp_path, "run", "--events", str(events), "--horizon-days", days)
    assert line.startswith("hybridflow run: error: argument --horizon-days: ")
    assert ("between 1 and 3650 days" in line) or ("not a whole number" in line)


def test_train_refuses_a_path_for_a_run_id_and_a_run_the_store_does_not_hold(tmp_path):
    line = _refused(tmp_path, "train", "--run-id", "../../x")
    assert line.startswith("hybridflow train: error: argument --run-id: not a run id: '../../x'")
    line = _refused(tmp_path, "train", "--run-id", "no-such-run")
    assert line.startswith("hybridflow: error: no run 'no-such-run' with a finished preprocess")


def test_serve_refuses_a_port_out_of_range(tmp_path):
    line = _refused(tmp_path, "serve", "--port", "99999")
    assert line == (
        "hybridflow serve: error: argument --port: must be between 0 and 65535: 99999 "
        "(see hybridflow serve --help)"
    )


@pytest.mark.parametrize(
    ("pattern", "says"),
    [
        ("%Y-%m-%d", "looks like a strptime format"),
        ("yyyy-qq", "'q' is not a letter Spark parses dates with"),
        ("dd/MM/yyyy 'at HH:mm", "a quote ' is never closed"),
    ],
)
def test_a_bad_timestamp_format_is_refused_before_any_engine(tmp_path, pattern, says):
    events = tmp_path / "events.csv"
    events.write_text(GOOD_CSV)
    line = _refused(tmp_path, "run", "--events", str(events), "--timestamp-format", pattern)
    assert line.startswith(f"hybridflow: error: --timestamp-format {pattern!r}")
    assert says in line


def test_an_events_path_in_a_symbolic_link_loop_is_refused(tmp_path):
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    line = _refused(tmp_path, "features", "--events", str(loop))
    assert line.startswith(f"hybridflow: error: cannot resolve events path {loop}")
