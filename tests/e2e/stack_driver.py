"""Helpers for the end-to-end stack test: the CLI, the Prefect API, the S3 server, a browser."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
HYBRIDFLOW = str(Path(sys.executable).parent / "hybridflow")
FINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}


def cli(args: list[str], env: dict[str, str], timeout: float = 400) -> str:
    """Run ``hybridflow ARGS`` in the repo; its output, or an assertion error showing it."""
    started = time.monotonic()
    proc = subprocess.run(
        [HYBRIDFLOW, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
    )
    print(
        f"{time.strftime('%H:%M:%S')} hybridflow {' '.join(args)}: {time.monotonic() - started:.1f}s"
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"hybridflow {' '.join(args)} exited {proc.returncode}:\n{output}"
    return output


def child_runs(client, parent_id) -> dict[str, Any]:
    """The dispatched children of flow run ``parent_id``, by deployment name."""
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId

    runs = client.read_flow_runs(
        flow_run_filter=FlowRunFilter(
            parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[parent_id])
        )
    )
    names = {d.id: d.name for d in client.read_deployments()}
    return {names.get(r.deployment_id, "in-process"): r for r in runs if r.deployment_id}


def wait_for(what: str, probe: Callable[[], Any], timeout: float, every: float = 1.0) -> Any:
    """Poll ``probe`` until it returns something truthy."""
    started = time.monotonic()
    deadline = started + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value:
            print(
                f"{time.strftime('%H:%M:%S')} waited {time.monotonic() - started:.1f}s for {what}"
            )
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def stack_state(stack_dir: Path) -> dict[str, Any]:
    """The stack's recorded state (URLs, PIDs)."""
    return json.loads((stack_dir / "stack.json").read_text())


def keep_logs(stack_dir: Path, output_dir: Path) -> None:
    """The stack's logs (server, workers and the flow runs they ran) copied to the test's output
    folder, where they outlive the stack's temporary folder."""
    logs = stack_dir / "logs"
    if logs.is_dir():
        shutil.copytree(logs, output_dir / "stack-logs", dirs_exist_ok=True)


def _mapped_archives(text: str) -> set[Path]:
    """The class archives a JVM command line (or a log quoting it) maps, resolved: a worktree's
    environment may reach the installation's archive through a symbolic link."""
    return {Path(p).resolve() for p in re.findall(r'-XX:SharedArchiveFile=([^\s"]+)', text)}


def assert_cluster_maps_class_archive(pids: list[int], cluster_dir: Path) -> None:
    """Every JVM of a stack's Spark cluster (the running master, workers and Connect server by
    ``pids``, the executors by the command their workers logged) started from the
    installation's class archive, and none was refused it (the JVM warns when it refuses one)."""
    from infra.compute.jvm_archive import archive_path
    from infra.settings import HybridflowSettings

    archive = archive_path(HybridflowSettings(_env_file=None).class_archive_dir()).resolve()
    for pid in pids:
        command = Path(f"/proc/{pid}/cmdline").read_bytes().decode().replace("\0", " ")
        assert archive in _mapped_archives(command), f"pid {pid} does not map {archive}: {command}"
    executor_logs = sorted((cluster_dir / "spark").rglob("stderr"))
    assert executor_logs, f"no executor logs under {cluster_dir / 'spark'}"
    for log in executor_logs:
        text = log.read_text(errors="replace")
        assert archive in _mapped_archives(text), f"{log}: the executor does not map {archive}"
    logs = [*(cluster_dir / "logs").glob("spark-*.log"), *executor_logs]
    refused = [
        str(f) for f in logs if "Unable to use shared archive" in f.read_text("utf-8", "replace")
    ]
    assert not refused, f"the JVM refused the class archive: {refused}"


def ensure_chromium() -> str:
    """Debian's chromium, installed with apt-get when missing (CI machines start clean)."""
    found = shutil.which("chromium")
    if found:
        return found
    env = os.environ | {"DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-q", "chromium"]
    if subprocess.run(install, env=env, timeout=600).returncode != 0:
        subprocess.run(["apt-get", "update", "-q"], env=env, check=True, timeout=600)
        subprocess.run(install, env=env, check=True, timeout=600)
    found = shutil.which("chromium")
    assert found, "apt-get install chromium did not provide a chromium executable"
    return found


def chromium(url: str, profile: Path, *extra: str, timeout: float = 120) -> str:
    """Headless chromium on ``url`` after the page's scripts ran; returns stdout."""
    args = [
        ensure_chromium(),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        f"--user-data-dir={profile}",
        "--window-size=1400,1000",
        "--virtual-time-budget=15000",
        *extra,
        url,
    ]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"chromium exited {proc.returncode}: {proc.stderr[-2000:]}"
    return proc.stdout
