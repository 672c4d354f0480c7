"""Real-time endpoint: latency and throughput at concurrency 1, 8, 32 against a bare ASGI handler
calling the same model on the same snapshot (same run, same uvicorn), then the same load while the
production alias moves every second (hot reloads; errors must be 0).

``ratio`` is endpoint/bare throughput; ``cpu_ratio`` is bare/endpoint server CPU time per request,
which other load on a shared machine disturbs far less than wall-clock figures.

Everything runs in separate processes: the endpoint (``python -m serving``), the bare handler and
the load generator (a lean asyncio HTTP/1.1 keep-alive client, so the client costs little CPU).
Run it: ``python -m bench serving``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

CUSTOMERS = 20_000
CONCURRENCY = (1, 8, 32)
SECONDS = 4.0
WARMUP_SECONDS = 1.0
RELOAD_SECONDS = 8.0
RELOAD_EVERY_S = 1.0
REPO = Path(__file__).resolve().parents[1]


def main(results_dir: Path) -> list[dict]:
    """Run every measurement; rows for the bench table."""
    from infra.storage.registry import ModelRegistry
    from infra.storage.store import LocalFolderStore
    from tests.fixtures.serving_sample import (
        publish_sample_snapshot,
        register_sample_model,
        sample_feature_table,
    )

    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="hf-bench-serving-") as tmp:
        root = Path(tmp)
        store = LocalFolderStore(root / "store")
        table = sample_feature_table(CUSTOMERS, seed=1)
        publish_sample_snapshot(store, table, dt.date(2025, 12, 31))
        register_sample_model(store, table, seed=1)
        env = {
            "HYBRIDFLOW_STORE": str(root / "store"),
            "HYBRIDFLOW_SERVE__POLL_INTERVAL_S": "0.25",
        }
        endpoint_cmd = [sys.executable, "-m", "serving", "--port", "0"]
        bare_cmd = [
            sys.executable,
            "-m",
            "bench.bench_serving",
            "bare",
            "--store",
            env["HYBRIDFLOW_STORE"],
        ]
        with (
            _server(endpoint_cmd, root / "endpoint", env) as endpoint,
            _server(bare_cmd, root / "bare", env) as bare,
        ):
            for c in CONCURRENCY:
                subject = _load(endpoint, c, SECONDS)
                baseline = _load(bare, c, SECONDS)
                rows.append(
                    {
                        "benchmark": "serving",
                        "subject": f"endpoint c={c}",
                        "baseline": f"bare ASGI c={c}",
                        "ratio": subject["rps"] / baseline["rps"],
                        "rps": subject["rps"],
                        "p50_ms": subject["p50_ms"],
                        "p95_ms": subject["p95_ms"],
                        "p99_ms": subject["p99_ms"],
                        "errors": subject["errors"],
                        "cpu_us_per_req": subject["cpu_us_per_req"],
                        "cpu_ratio": baseline["cpu_us_per_req"] / subject["cpu_us_per_req"],
                        "base_cpu_us_per_req": baseline["cpu_us_per_req"],
                        "base_rps": baseline["rps"],
                        "base_p50_ms": baseline["p50_ms"],
                        "base_p99_ms": baseline["p99_ms"],
                    }
                )
            steady = next(r for r in rows if r["subject"] == "endpoint c=8")
            registry = ModelRegistry(store)
            versions = [register_sample_model(store, table, seed=s, promote=False) for s in (2, 3)]
            loadgen = _start_load(endpoint, 8, RELOAD_SECONDS)
            moves = 0
            started = time.monotonic()
            while time.monotonic() - started < RELOAD_SECONDS - RELOAD_EVERY_S:
                time.sleep(RELOAD_EVERY_S)
                registry.set_alias(versions[moves % 2], "bench: hot reload under load")
                moves += 1
            during = _finish_load(loadgen)
            rows.append(
                {
                    "benchmark": "serving",
                    "subject": f"endpoint c=8 during {moves} hot reloads",
                    "baseline": "endpoint c=8 steady",
                    "ratio": during["rps"] / steady["rps"],
                    "rps": during["rps"],
                    "p50_ms": during["p50_ms"],
                    "p95_ms": during["p95_ms"],
                    "p99_ms": during["p99_ms"],
                    "errors": during["errors"],
                    "versions_seen": len(during["versions"]),
                }
            )
    (results_dir / "bench_serving_detail.json").write_text(json.dumps(rows, indent=2))
    return rows


@contextlib.contextmanager
def _server(cmd: list[str], workdir: Path, env: dict[str, str]) -> Iterator[Server]:
    """Start a server process on a free loopback port; yields it; stops it by PID."""
    workdir.mkdir(parents=True)
    port_file = workdir / "port"
    log = open(workdir / "log", "wb")
    proc = subprocess.Popen(
        [*cmd, "--port-file", str(port_file)],
        cwd=workdir,
        env=_env(env),
        stdout=log,
        stderr=log,
    )
    try:
        deadline = time.monotonic() + 120
        while not port_file.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{cmd} did not start: {(workdir / 'log').read_text()}")
            time.sleep(0.1)
        url = f"http://127.0.0.1:{port_file.read_text()}"
        _wait_ready(url, deadline)
        yield Server(url, proc.pid)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@dataclass
class Server:
    """A server process under test."""

    url: str
    pid: int

    def cpu_seconds(self) -> float:
        """User + system CPU time the process has used so far (Linux /proc)."""
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _wait_ready(url: str, deadline: float) -> None:
    import httpx

    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.TransportError):
            if httpx.post(f"{url}/predict", json={"customer_id": "c000000"}).status_code == 200:
                return
        time.sleep(0.2)
    raise RuntimeError(f"{url} never answered /predict")


def _start_load(server: Server, concurrency: int, seconds: float) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "bench.bench_serving", "load", "--url", server.url]
    cmd += ["--concurrency", str(concurrency), "--seconds", str(seconds)]
    cmd += ["--warmup", str(WARMUP_SECONDS)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=_env({}))


def _env(extra: dict[str, str]) -> dict[str, str]:
    """The environment of a helper process: ``bench`` importable from anywhere."""
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    return os.environ | extra | {"PYTHONPATH": path}


def _finish_load(proc: subprocess.Popen) -> dict:
    out, _ = proc.communicate(timeout=120)
    if proc.returncode != 0:
        raise RuntimeError(f"load generator failed ({proc.returncode}): {out}")
    return json.loads(out.strip().splitlines()[-1])


def _load(server: Server, concurrency: int, seconds: float) -> dict:
    """Run the load generator against ``server``; adds the server's CPU time per request (robust
    against other load on the machine, unlike wall-clock latency). Warm-up requests are in the
    CPU figure too, so it is a slight over-estimate for both subjects alike."""
    cpu_before = server.cpu_seconds()
    result = _finish_load(_start_load(server, concurrency, seconds))
    cpu = server.cpu_seconds() - cpu_before
    result["cpu_us_per_req"] = cpu / max(result["requests"] + result["warmup_requests"], 1) * 1e6
    return result


# --- the load generator (its own process) -------------------------------------------------


async def _client(
    host: str, port: int, deadline: float, measure_from: float, ids: int, stats: dict
) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    rng = random.Random()
    try:
        while (now := time.perf_counter()) < deadline:
            body = json.dumps({"customer_id": f"c{rng.randrange(ids):06d}"}).encode()
            request = (
                b"POST /predict HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
                b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
            )
            try:
                writer.write(request)
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line[:15].lower() == b"content-length:":
                        length = int(line[15:])
                payload = await reader.readexactly(length)
                ok = head[9:12] == b"200"
            except (OSError, asyncio.IncompleteReadError):
                ok, payload = False, b""
                writer.close()
                reader, writer = await asyncio.open_connection(host, port)
            elapsed = time.perf_counter() - now
            if now < measure_from:
                stats["warmup"] += 1
                continue
            stats["latencies"].append(elapsed)
            if not ok:
                stats["errors"] += 1
                continue
            start = payload.find(b'"model_version":"')
            if start >= 0:
                end = payload.index(b'"', start + 17)
                stats["versions"][payload[start + 17 : end].decode()] += 1
    finally:
        writer.close()


async def _run_load(url: str, concurrency: int, seconds: float, warmup: float) -> dict:
    host, port = url.removeprefix("http://").split(":")
    stats: dict = {"latencies": [], "errors": 0, "warmup": 0, "versions": Counter()}
    begin = time.perf_counter()
    measure_from = begin + warmup
    deadline = measure_from + seconds
    await asyncio.gather(
        *(
            _client(host, int(port), deadline, measure_from, CUSTOMERS, stats)
            for _ in range(concurrency)
        )
    )
    lat = sorted(stats["latencies"])

    def pct(q: float) -> float:
        return lat[min(len(lat) - 1, int(q * len(lat)))] * 1000 if lat else float("nan")

    return {
        "requests": len(lat),
        "warmup_requests": stats["warmup"],
        "errors": stats["errors"],
        "rps": len(lat) / seconds,
        "p50_ms": pct(0.50),
        "p95_ms": pct(0.95),
        "p99_ms": pct(0.99),
        "versions": dict(stats["versions"]),
    }


# --- the bare ASGI handler (its own process) ----------------------------------------------


def _bare_app(store_uri: str):
    """The least an ASGI app can do to answer the same request with the same model."""
    import torch

    from infra.storage.registry import ModelRegistry
    from infra.storage.store import open_store
    from serving.scorer import fast_scorer
    from serving.snapshot import load_snapshot, newest_snapshot_manifest
    from tasks.ml.models import load_model

    torch.set_num_threads(1)
    store = open_store(store_uri)
    registry = ModelRegistry(store)
    version = registry.alias().version
    manifest, files = registry.read_files(version)
    model = load_model(files, manifest.files)
    score_rows = fast_scorer(model)  # the endpoint's scoring path
    snapshot = load_snapshot(store, newest_snapshot_manifest(store))
    columns = snapshot.column_indices(model.features)
    headers = [(b"content-type", b"application/json")]

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        body, more = b"", True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        row = snapshot.row_of[json.loads(body)["customer_id"]]
        score = float(score_rows(snapshot.values[row : row + 1, columns])[0])
        out = json.dumps({"score": score, "model_version": version}).encode()
        length = [(b"content-length", str(len(out)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers + length})
        await send({"type": "http.response.body", "body": out})

    return app


def _serve_bare(store_uri: str, port_file: Path) -> None:
    import uvicorn

    from serving.server import bind_socket

    app = _bare_app(store_uri)
    sock = bind_socket("127.0.0.1", 0)
    port_file.write_text(str(sock.getsockname()[1]))
    config = uvicorn.Config(
        app, lifespan="off", log_config=None, log_level="warning", access_log=False
    )
    uvicorn.Server(config).run(sockets=[sock])


def cli(argv: list[str]) -> int:
    """Entry points of the helper processes: ``bare`` and ``load``."""
    parser = argparse.ArgumentParser(prog="bench.bench_serving")
    sub = parser.add_subparsers(dest="role", required=True)
    bare = sub.add_parser("bare")
    bare.add_argument("--store", required=True)
    bare.add_argument("--port-file", type=Path, required=True)
    load = sub.add_parser("load")
    load.add_argument("--url", required=True)
    load.add_argument("--concurrency", type=int, required=True)
    load.add_argument("--seconds", type=float, required=True)
    load.add_argument("--warmup", type=float, default=1.0)
    args = parser.parse_args(argv)
    if args.role == "bare":
        _serve_bare(args.store, args.port_file)
    else:
        result = asyncio.run(_run_load(args.url, args.concurrency, args.seconds, args.warmup))
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(cli(sys.argv[1:]))
