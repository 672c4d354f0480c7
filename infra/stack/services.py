"""The stack's services: how each is started and how we know it is ready."""

from __future__ import annotations

import socket
import sys
import time
from pathlib import Path

import httpx

from infra.errors import HybridflowInputError

EVENTS_WATCH_INTERVAL_S = 5.0


def bin_path(name: str) -> str:
    """An executable installed beside this Python (the project's venv)."""
    candidate = Path(sys.executable).parent / name
    return str(candidate) if candidate.exists() else name


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (asked of the OS)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_in_use(port: int) -> bool:
    """True when something already listens on 127.0.0.1:``port``."""
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def server_command(port: int) -> list[str]:
    """The Prefect server (API + UI), loopback only."""
    return [bin_path("prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port)]


def worker_command(pool: str) -> list[str]:
    """One process worker for ``pool``."""
    return [
        bin_path("prefect"),
        "worker",
        "start",
        "--pool",
        pool,
        "--type",
        "process",
        "--name",
        f"hybridflow-{pool}",
    ]


def events_watch_command(
    into: Path | None = None, interval_s: float = EVENTS_WATCH_INTERVAL_S
) -> list[str]:
    """``hybridflow events watch``: the events log's new segments announced to the server
    (and exported ``into`` an events folder first)."""
    command = [bin_path("hybridflow"), "events", "watch", "--interval", f"{interval_s:g}"]
    return command + (["--into", str(into)] if into is not None else [])


def s3_command(port: int) -> list[str]:
    """moto's S3-compatible server, loopback only."""
    return [bin_path("moto_server"), "-H", "127.0.0.1", "-p", str(port)]


def wait_http_ok(url: str, timeout_s: float, what: str, log_file: Path | None = None) -> None:
    """Poll ``url`` until it answers 200; a clear error (with the log's tail) otherwise."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    tail = ""
    if log_file and log_file.exists():
        tail = " | ".join(log_file.read_text(errors="replace").strip().splitlines()[-5:])
    raise RuntimeError(f"{what} did not become ready at {url} within {timeout_s:.0f}s: {tail}")


def check_port_free(port: int, what: str) -> None:
    """Refuse a port that something else listens on."""
    if port_in_use(port):
        raise HybridflowInputError(
            f"port {port} on 127.0.0.1 is in use: pick another one for {what} with --port"
        )
