"""Start ``hybridflow serve`` as a real process on a free loopback port, and stop it by PID."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx


@dataclass
class ServerProcess:
    """A running endpoint: its base URL, process and log file."""

    url: str
    process: subprocess.Popen
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@contextlib.contextmanager
def running_server(
    store: Path, workdir: Path, env: dict[str, str] | None = None, timeout_s: float = 90.0
) -> Iterator[ServerProcess]:
    """``python -m cli.main serve --port 0``; yields once the port is open and /health answers."""
    workdir.mkdir(parents=True, exist_ok=True)
    port_file = workdir / "port"
    log_path = workdir / "serve.log"
    full_env = os.environ | {"HYBRIDFLOW_STORE": str(store)} | (env or {})
    cmd = [sys.executable, "-m", "cli.main", "serve", "--port", "0", "--port-file", str(port_file)]
    with open(log_path, "wb") as log:
        process = subprocess.Popen(cmd, cwd=workdir, env=full_env, stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + timeout_s
        while not port_file.exists():
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"server did not start:\n{log_path.read_text()}")
            time.sleep(0.1)
        url = f"http://127.0.0.1:{int(port_file.read_text())}"
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"server did not answer /health:\n{log_path.read_text()}")
            time.sleep(0.1)
        yield ServerProcess(url=url, process=process, log_path=log_path)
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=5)


def wait_for(predicate, timeout_s: float, what: str, interval_s: float = 0.05):
    """Poll ``predicate`` until it returns something truthy; AssertionError naming ``what``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


def metric_value(text: str, name: str, **labels: str) -> float:
    """A sample's value from Prometheus text (0.0 when the labelled series does not exist)."""
    for line in text.splitlines():
        if not line.startswith(name):
            continue
        m = re.match(r"^([a-zA-Z_:][\w:]*)(?:\{(.*)\})?\s+(\S+)$", line)
        if not m or m.group(1) != name:
            continue
        found = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
        if all(found.get(k) == v for k, v in labels.items()):
            return float(m.group(3))
    return 0.0
